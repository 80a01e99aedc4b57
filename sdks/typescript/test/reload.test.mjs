// A reload (SIGHUP: the daemon re-executes itself in place, keeping its agents) while a prompt is
// in flight: the daemon answers the waiting POST 202 and the agent's answer arrives on the event
// stream after the reload. The SDK resolves the prompt from the stream, so the caller notices
// nothing but the time the reload took; the same session goes on afterwards.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { AcpHttpClient } from "acp-http-client";
import { startDaemon, eventually, binaryExists, BIN } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

const text = (t) => [{ type: "text", text: t }];

test("a prompt in flight across a reload resolves from the event stream, and the session goes on", async () => {
  const d = await startDaemon();
  const updates = [];
  const c = new AcpHttpClient({
    baseUrl: d.url,
    serverId: "reloaded",
    agent: "mock",
    reconnectInitialMs: 50,
    reconnectMaxMs: 200,
    client: { sessionUpdate: (n) => void updates.push(n.update.content?.text ?? n.update.sessionUpdate) },
  });
  try {
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    const pidBefore = await agentPid(d.url, "reloaded");
    assert.ok(Number.isInteger(pidBefore), "the listing names the agent's pid");
    // The agent answers after 3 s; the reload comes while the POST waits.
    const inFlight = c.prompt({ sessionId, prompt: text("/sleep 3000") });
    await new Promise((r) => setTimeout(r, 500));
    d.child.kill("SIGHUP");
    await eventually(() => /reload: executing the new image/.test(d.stderr()), { what: "the reload's exec", timeoutMs: 20_000 });
    const answer = await inFlight;
    assert.equal(answer.stopReason, "end_turn");
    assert.equal(await agentPid(d.url, "reloaded"), pidBefore, "the agent was carried, not restarted");
    const next = await c.prompt({ sessionId, prompt: text("after the reload") });
    assert.equal(next.stopReason, "end_turn");
    await eventually(() => updates.includes("after the reload"), { what: "the next turn's update" });
    await c.close();
  } finally {
    await d.stop();
  }
});

async function agentPid(url, serverId) {
  const res = await fetch(`${url}/v1/acp`);
  const body = await res.json();
  const s = body.servers.find((x) => x.serverId === serverId);
  return s?.pid;
}
