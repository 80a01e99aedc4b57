// The WebSocket transport (`transport: "websocket"`) against the daemon's WebSocket face of
// /v1/acp/{serverId}: ordering, a typed error when the agent dies, resume after a cut socket, and
// the product SDK over it. Skips (fails under strict mode) when the daemon has no WebSocket face.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import WS from "ws";
import { AcpHttpClient, AcpHttpError } from "acp-http-client";
import { SandboxAgentClient, HttpError } from "sandbox-agent";
import { startDaemon, startProxy, eventually, binaryExists, BIN, skipOrFail, chunkTexts } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

// Node 20 has no global WebSocket (22 has); `ws` takes the same (url, { headers }) form.
const createWebSocket = (url, headers) => new (globalThis.WebSocket ?? WS)(url, { headers });
const text = (t) => [{ type: "text", text: t }];

/** True when the daemon upgrades GET /v1/acp/{id} to a WebSocket. */
async function hasWebSocket(url, token) {
  return new Promise((resolve) => {
    const headers = token ? { authorization: `Bearer ${token}` } : {};
    const ws = new WS(`${url.replace("http", "ws")}/v1/acp/probe-ws?agent=mock`, { headers });
    ws.on("open", () => {
      ws.close();
      resolve(true);
    });
    ws.on("error", () => resolve(false));
  });
}

async function withWsDaemon(t, f, opts) {
  const d = await startDaemon(opts);
  try {
    if (!(await hasWebSocket(d.url, opts?.token))) return skipOrFail(t, "this daemon has no WebSocket on /v1/acp/{serverId}");
    await fetch(`${d.url}/v1/acp/probe-ws`, { method: "DELETE", headers: opts?.token ? { authorization: `Bearer ${opts.token}` } : {} });
    await f(d);
  } finally {
    await d.stop();
  }
}

test("websocket: initialize, session, /stream 500 in order, with a token", (t) =>
  withWsDaemon(t, async (d) => {
    const updates = [];
    const c = new AcpHttpClient({
      baseUrl: d.url, serverId: "ws-1", agent: "mock", token: "wstok", transport: "websocket", createWebSocket,
      client: { sessionUpdate: (n) => void updates.push(n) },
    });
    assert.equal((await c.initialize()).agentInfo.name, "mock");
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    assert.equal((await c.prompt({ sessionId, prompt: text("/stream 500") })).stopReason, "end_turn");
    await eventually(() => updates.length === 500, { what: "500 updates" });
    assert.deepEqual(updates.map((u) => u.update.content.text), Array.from({ length: 500 }, (_, i) => `chunk ${i + 1} of 500`));
    assert.ok(c.transport.lastEventId >= 500);
    await c.close();
    const servers = (await (await fetch(`${d.url}/v1/acp`, { headers: { authorization: "Bearer wstok" } })).json()).servers;
    assert.equal(servers.find((s) => s.serverId === "ws-1"), undefined, "close() DELETEd the serverId");
  }, { token: "wstok" }));

test("websocket: a cut socket resumes with lastEventId and loses nothing", (t) =>
  withWsDaemon(t, async (d) => {
    const proxy = await startProxy(d.url, { cutSseAfterBytes: 20_000 });
    try {
      const updates = [];
      const c = new AcpHttpClient({
        baseUrl: proxy.url, serverId: "ws-cut", agent: "mock", transport: "websocket", createWebSocket,
        client: { sessionUpdate: (n) => void updates.push(n) },
      });
      await c.initialize();
      const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
      await c.prompt({ sessionId, prompt: text("/stream 2000") });
      await eventually(() => updates.length >= 2000, { what: "2000 updates" });
      assert.deepEqual(updates.map((u) => u.update.content.text), Array.from({ length: 2000 }, (_, i) => `chunk ${i + 1} of 2000`));
      assert.ok(c.transport.reconnects >= 1, "the socket was re-opened");
      await c.close();
    } finally {
      await proxy.close();
    }
  }));

test("websocket: /crash 3 rejects the waiting prompt with a typed error", (t) =>
  withWsDaemon(t, async (d) => {
    const c = new AcpHttpClient({ baseUrl: d.url, serverId: "ws-crash", agent: "mock", transport: "websocket", createWebSocket });
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    await c.prompt({ sessionId, prompt: text("/stderr dying words") });
    const e = await c.prompt({ sessionId, prompt: text("/crash 3") }).catch((err) => err);
    assert.ok(e instanceof AcpHttpError, `got ${e}`);
    assert.equal(e.status, 502);
    assert.equal(e.exitCode, 3);
    assert.equal(e.exitReason, "exited");
    // No stderrTail here: the daemon closes the socket without answering, and the listing the
    // transport reads instead has none (docs/sdk-typescript.md).
    await c.close();
  }));

test("websocket: the product SDK over it — prompt, permission, updates before the answer", (t) =>
  withWsDaemon(t, async (d) => {
    const events = [];
    const c = new SandboxAgentClient({
      baseUrl: d.url, agent: "mock", transport: "websocket", createWebSocket,
      onSessionUpdate: (e) => void events.push(e),
      onPermissionRequest: (r) => r.options.find((o) => o.kind === "allow_once").optionId,
    });
    const { sessionId } = await c.newSession();
    assert.equal((await c.prompt({ sessionId, prompt: "/stream 100" })).stopReason, "end_turn");
    assert.deepEqual(chunkTexts(events), Array.from({ length: 100 }, (_, i) => `chunk ${i + 1} of 100`));
    assert.equal((await c.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
    const bad = new SandboxAgentClient({ baseUrl: d.url, agent: "no-such-agent", transport: "websocket", createWebSocket });
    const err = await bad.ready.catch((x) => x);
    assert.ok(err instanceof HttpError, `got ${err}`);
    await c.disconnect();
  }));
