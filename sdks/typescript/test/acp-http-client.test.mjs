// acp-http-client against the real daemon and its mock agent: resume after a cut stream, gap,
// typed problem errors, 410 as the end, DELETE on close.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { AcpHttpClient, AcpHttpError } from "acp-http-client";
import { startDaemon, startProxy, eventually, binaryExists, BIN } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

const text = (t) => [{ type: "text", text: t }];

function collect() {
  const updates = [];
  return { updates, client: { sessionUpdate: (n) => void updates.push(n) } };
}

async function instances(url) {
  return (await (await fetch(`${url}/v1/acp`)).json()).servers;
}

test("an event stream cut mid-stream resumes with Last-Event-ID and loses nothing", async () => {
  const d = await startDaemon();
  // The first event stream is cut after 20 KB, well inside the ~300 KB of 2000 chunks.
  const proxy = await startProxy(d.url, { cutSseAfterBytes: 20_000 });
  try {
    const { updates, client } = collect();
    const c = new AcpHttpClient({ baseUrl: proxy.url, serverId: "cut", agent: "mock", client });
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    const res = await c.prompt({ sessionId, prompt: text("/stream 2000") });
    assert.equal(res.stopReason, "end_turn");
    await eventually(() => updates.length >= 2000, { what: "2000 updates" });
    const got = updates.map((u) => u.update.content.text);
    const want = Array.from({ length: 2000 }, (_, i) => `chunk ${i + 1} of 2000`);
    assert.deepEqual(got, want, "every chunk exactly once, in order");
    assert.ok(c.transport.reconnects >= 1, "the stream was re-opened");
    const resumed = proxy.sseRequests.slice(1);
    assert.ok(resumed.some((h) => /last-event-id: \d+/i.test(h)), "a re-opened stream sent Last-Event-ID");
    await c.close();
  } finally {
    await proxy.close();
    await d.stop();
  }
});

test("events evicted while the client was away surface as a gap", async () => {
  const d = await startDaemon({ args: ["--event-buffer", "16"] });
  const proxy = await startProxy(d.url);
  try {
    const gaps = [];
    const { updates, client } = collect();
    const c = new AcpHttpClient({
      baseUrl: proxy.url, serverId: "gap", agent: "mock", client, onGap: (g) => gaps.push(g),
    });
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    await c.prompt({ sessionId, prompt: text("/stream 4") });
    await eventually(() => updates.length === 4, { what: "first 4 updates" });
    const seen = c.transport.lastEventId;
    assert.equal(seen, 4);
    // Take the stream away, let 200 events overrun the 16-event ring, then let it come back.
    proxy.holdSse(true);
    proxy.cutSse();
    await eventually(() => proxy.sseRequests.length >= 2, { what: "a held reconnect" });
    await c.prompt({ sessionId, prompt: text("/stream 200") });
    proxy.holdSse(false);
    await eventually(() => gaps.length === 1 && updates.length === 4 + 16, { what: "gap and the retained events" });
    assert.deepEqual(gaps[0], { from: seen + 1, to: seen + 200 - 16 });
    const tail = updates.slice(4).map((u) => u.update.content.text);
    assert.deepEqual(tail, Array.from({ length: 16 }, (_, i) => `chunk ${200 - 15 + i} of 200`));
    await c.close();
  } finally {
    await proxy.close();
    await d.stop();
  }
});

test("an agent that exits rejects the waiting call with a typed problem, then the connection ends", async () => {
  const d = await startDaemon();
  try {
    const c = new AcpHttpClient({ baseUrl: d.url, serverId: "crash", agent: "mock" });
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    await c.prompt({ sessionId, prompt: text("/stderr last words before the crash") });
    const err = await c.prompt({ sessionId, prompt: text("/crash 3") }).then(
      () => assert.fail("the prompt should have failed"),
      (e) => e,
    );
    assert.ok(err instanceof AcpHttpError, `got ${err}`);
    assert.equal(err.status, 502);
    assert.equal(err.exitCode, 3);
    assert.equal(err.exitReason, "exited");
    assert.match(err.stderrTail, /last words before the crash/);
    assert.equal(err.problem.serverId, "crash");
    // The stream then answers 410: the transport treats it as the end of the connection.
    let timer;
    await Promise.race([c.closed, new Promise((_, rej) => (timer = setTimeout(() => rej(new Error("not closed")), 10_000)))]);
    clearTimeout(timer);
    assert.equal(c.transport.endReason?.status, 410);
    await assert.rejects(c.newSession({ cwd: "/", mcpServers: [] }));
    await c.close();
    await eventually(async () => !(await instances(d.url)).some((s) => s.serverId === "crash"), {
      what: "close() to DELETE the exited instance",
    });
  } finally {
    await d.stop();
  }
});

test("close() DELETEs the serverId; detach() leaves it running for another client", async () => {
  const d = await startDaemon();
  try {
    const a = new AcpHttpClient({ baseUrl: d.url, serverId: "keep", agent: "mock" });
    await a.initialize();
    const { sessionId } = await a.newSession({ cwd: "/", mcpServers: [] });
    await a.prompt({ sessionId, prompt: text("/stream 3") });
    await eventually(() => a.transport.lastEventId === 3, { what: "3 events" });
    await a.transport.detach();
    assert.equal((await instances(d.url)).find((s) => s.serverId === "keep")?.status, "running");
    // A new client attaches without ?agent, resumes after event 3, and sees only newer events.
    const { updates, client } = collect();
    const b = new AcpHttpClient({ baseUrl: d.url, serverId: "keep", client, lastEventId: 3 });
    await b.prompt({ sessionId, prompt: text("/stream 2") });
    await eventually(() => updates.length === 2, { what: "2 new updates" });
    assert.deepEqual(updates.map((u) => u.update.content.text), ["chunk 1 of 2", "chunk 2 of 2"]);
    await b.close();
    assert.equal((await instances(d.url)).find((s) => s.serverId === "keep"), undefined);
  } finally {
    await d.stop();
  }
});

test("problem answers are typed: bad serverId, unknown agent, wrong token", async () => {
  const d = await startDaemon({ token: "s3cret" });
  try {
    const bad = new AcpHttpClient({ baseUrl: d.url, serverId: "no spaces allowed", agent: "mock", token: "s3cret" });
    const e1 = await bad.initialize().catch((e) => e);
    assert.ok(e1 instanceof AcpHttpError);
    assert.equal(e1.status, 400);
    const unknown = new AcpHttpClient({ baseUrl: d.url, serverId: "u", agent: "no-such-agent", token: "s3cret" });
    const e2 = await unknown.initialize().catch((e) => e);
    assert.equal(e2.status, 400);
    const noauth = new AcpHttpClient({ baseUrl: d.url, serverId: "a", agent: "mock", token: "wrong" });
    const e3 = await noauth.initialize().catch((e) => e);
    assert.equal(e3.status, 401);
    assert.equal(typeof e3.title, "string");
    const ok = new AcpHttpClient({ baseUrl: d.url, serverId: "a", agent: "mock", token: "s3cret" });
    assert.equal((await ok.initialize()).agentInfo.name, "mock");
    // An agent-side JSON-RPC error stays an agent error (not an HTTP problem).
    const e4 = await ok.request("no/such_method", {}).catch((e) => e);
    assert.ok(!(e4 instanceof AcpHttpError));
    assert.equal(e4.code, -32601);
    await Promise.all([bad.close(), unknown.close(), noauth.close(), ok.close()]);
  } finally {
    await d.stop();
  }
});

test("a network failure is a typed error with status 0", async () => {
  const c = new AcpHttpClient({ baseUrl: "http://127.0.0.1:9", serverId: "x", agent: "mock" });
  const e = await c.initialize().catch((err) => err);
  assert.ok(e instanceof AcpHttpError);
  assert.equal(e.status, 0);
  await c.close();
});
