// A daemon with a state dir (--state-dir) killed outright and started again on the same port:
// the client notices nothing but a delay. Its event stream resumes from its last id (no event
// twice, none lost), nothing answered is sent again, and a prompt on the same session works
// because the daemon restores the session (session/load) before forwarding it.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AcpHttpClient } from "acp-http-client";
import { SandboxAgentClient } from "sandbox-agent";
import { startDaemon, eventually, binaryExists, BIN, chunkTexts } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

const text = (t) => [{ type: "text", text: t }];

// Whether every needle is somewhere in the files under `dir` (the state dir's logs and metadata
// hold the events' and the session records' JSON as written). A crash loses what the daemon's
// state writer had not written yet, so a test of recovery first waits for what it relies on.
function onDisk(dir, ...needles) {
  let all = "";
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) all += readFileSync(p).toString("latin1");
    }
  };
  try {
    walk(dir);
  } catch {
    return false;
  }
  return needles.every((n) => all.includes(n));
}

test("after a daemon crash and restart the same session continues through the same client", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sdk-durable-"));
  const args = ["--state-dir", join(dir, "state"), "--state-sync", "every"];
  const workDir = join(dir, "work");
  let d = await startDaemon({ args, workDir });
  const port = Number(new URL(d.url).port);
  const updates = [];
  const posts = [];
  const c = new AcpHttpClient({
    baseUrl: d.url,
    serverId: "durable",
    agent: "mock",
    reconnectInitialMs: 50,
    reconnectMaxMs: 200,
    client: { sessionUpdate: (n) => void updates.push(n.update.content?.text ?? n.update.sessionUpdate) },
    onEnvelope: (m, dir) => {
      if (dir === "outbound" && m.method) posts.push(m.method);
    },
  });
  try {
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    const first = await c.prompt({ sessionId, prompt: text("/stream 5") });
    assert.equal(first.stopReason, "end_turn");
    await eventually(() => updates.length === 5, { what: "the first turn's 5 updates" });
    const before = c.transport.lastEventId;
    await eventually(() => onDisk(join(dir, "state"), "chunk 5 of 5", `"sessionId":"${sessionId}","cwd"`), {
      what: "the first turn and the session record on disk",
    });

    // Crash: SIGKILL, no shutdown at all. Then the same daemon again on the same port.
    d.child.kill("SIGKILL");
    await d.stop();
    d = await startDaemon({ args, workDir, port });
    assert.equal(d.url, `http://127.0.0.1:${port}`);

    // The stream comes back by itself; the next prompt on the old session just works.
    const second = await c.prompt({ sessionId, prompt: text("/history") });
    assert.equal(second.stopReason, "end_turn");
    await eventually(() => updates.includes("history: /stream 5"), { what: "the restored session's history" });
    const firstTurn = Array.from({ length: 5 }, (_, i) => `chunk ${i + 1} of 5`);
    assert.deepEqual(updates, [...firstTurn, "history: /stream 5"], "every update once, in order");
    assert.ok(c.transport.lastEventId > before, "the numbering continued");
    assert.ok(c.transport.reconnects >= 1, "the stream was re-opened");
    // Nothing answered was sent again: the client sent exactly its own four requests.
    assert.deepEqual(posts, ["initialize", "session/new", "session/prompt", "session/prompt"]);
    await c.close();
  } finally {
    await d.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("SandboxAgentClient: a prompt after a daemon restart (graceful, as systemctl restart) continues the session", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sdk-durable-"));
  const args = ["--state-dir", join(dir, "state")];
  const workDir = join(dir, "work");
  let d = await startDaemon({ args, workDir });
  const port = Number(new URL(d.url).port);
  const events = [];
  const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock", onSessionUpdate: (e) => void events.push(e) });
  try {
    const { sessionId } = await c.newSession();
    assert.equal((await c.prompt({ sessionId, prompt: "first turn" })).stopReason, "end_turn");
    await d.stop();
    d = await startDaemon({ args, workDir, port });
    // prompt() resolves only once its updates arrived: the restored stream delivered them.
    assert.equal((await c.prompt({ sessionId, prompt: "/history" })).stopReason, "end_turn");
    assert.deepEqual(chunkTexts(events), ["first turn", "history: first turn"]);
    await c.disconnect();
  } finally {
    await d.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
