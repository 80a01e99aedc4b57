// sandbox-agent SandboxAgentClient against the real daemon and its mock agent: the connection
// gates of spec 004, session calls, permissions, cancel, client-side metadata.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  SandboxAgentClient,
  NotConnectedError,
  AlreadyConnectedError,
  UnsupportedError,
  HttpError,
  AgentError,
  PermissionReplyError,
} from "sandbox-agent";
import { JsonFileSessionStore } from "sandbox-agent/file-store";
import { startDaemon, startProxy, eventually, binaryExists, BIN, chunkTexts } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

async function withDaemon(f, opts) {
  const d = await startDaemon(opts);
  try {
    await f(d);
  } finally {
    await d.stop();
  }
}

async function listed(d, serverId) {
  const servers = (await (await fetch(`${d.url}/v1/acp`)).json()).servers;
  return servers.find((s) => s.serverId === serverId);
}

test("auto-connect: the constructor connects; ready resolves; the instance exists", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock" });
    await c.ready;
    assert.equal(c.connected, true);
    assert.match(c.serverId, /^sdk-mock-/);
    assert.equal(c.agentInfo.agentInfo.name, "mock");
    assert.equal((await listed(d, c.serverId))?.status, "running");
    const s = await c.newSession();
    assert.equal(typeof s.sessionId, "string");
    await c.disconnect();
  }));

test("auto-connect failure surfaces on ready and on the first call", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "no-such-agent" });
    const e = await c.ready.catch((err) => err);
    assert.ok(e instanceof HttpError, `got ${e}`);
    assert.equal(e.status, 400);
    const first = await c.newSession().catch((err) => err);
    assert.equal(first, e, "the first call reports the connect failure");
    await assert.rejects(c.newSession(), NotConnectedError);
  }));

test("autoConnect false: nothing happens until connect(); session calls are gated", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock", autoConnect: false, serverId: "manual" });
    assert.equal(c.connected, false);
    assert.equal(await listed(d, "manual"), undefined, "no instance before connect()");
    for (const call of [
      () => c.newSession(),
      () => c.prompt({ sessionId: "x", prompt: "hi" }),
      () => c.cancel("x"),
      () => c.loadSession({ sessionId: "x" }),
      () => c.resumeSession({ sessionId: "x" }),
      () => c.forkSession({ sessionId: "x" }),
      () => c.listSessions(),
      () => c.setSessionMode({ sessionId: "x", modeId: "m" }),
      () => c.setSessionConfigOption({ sessionId: "x", configId: "c", value: "v" }),
      () => c.setSessionModel({ sessionId: "x", modelId: "m" }),
    ]) {
      await assert.rejects(call(), NotConnectedError);
    }
    // Host APIs need no connection.
    const health = await c.getHealth();
    assert.equal(health.status, "ok");
    assert.equal(health.dataDir.writable, true);
    await c.connect();
    assert.equal((await listed(d, "manual"))?.status, "running");
    const { sessionId } = await c.newSession();
    assert.equal((await c.prompt({ sessionId, prompt: "hello" })).stopReason, "end_turn");
    await c.disconnect();
    await assert.rejects(c.newSession(), NotConnectedError, "gated again after disconnect()");
    assert.equal(await listed(d, "manual"), undefined, "disconnect() stopped the instance");
    // Reconnecting is allowed after a disconnect.
    await c.connect();
    assert.ok((await c.newSession()).sessionId);
    await c.disconnect();
  }));

test("single connection: connect() twice throws AlreadyConnectedError", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock" });
    // Still connecting: a second connect is refused too.
    await assert.rejects(c.connect(), AlreadyConnectedError);
    await c.ready;
    await assert.rejects(c.connect(), AlreadyConnectedError);
    const servers = (await (await fetch(`${d.url}/v1/acp`)).json()).servers;
    assert.equal(servers.length, 1, "one instance for one client");
    await c.disconnect();
  }));

test("/stream 200 arrives in order through onSessionUpdate before prompt() resolves", () =>
  withDaemon(async (d) => {
    // The event stream lags 300 ms behind the POST answers, as over a slow network.
    const proxy = await startProxy(d.url, { delaySseMs: 300 });
    try {
    const events = [];
    const c = new SandboxAgentClient({ baseUrl: proxy.url, agent: "mock", onSessionUpdate: (e) => void events.push(e) });
    const { sessionId } = await c.newSession();
    const res = await c.prompt({ sessionId, prompt: "/stream 200" });
    assert.equal(res.stopReason, "end_turn");
    // No waiting here: prompt() resolves only after its updates were delivered.
    assert.deepEqual(chunkTexts(events), Array.from({ length: 200 }, (_, i) => `chunk ${i + 1} of 200`));
    assert.ok(events.every((e) => e.sessionId === sessionId && e.serverId === c.serverId));
    await c.disconnect();
    } finally {
      await proxy.close();
    }
  }));

test("prompt() waits for the event the answer named, with no extra request; an older daemon is asked instead", () =>
  withDaemon(async (d) => {
    // The event stream lags 300 ms behind the POST answers, as over a slow network.
    const proxy = await startProxy(d.url, { delaySseMs: 300 });
    try {
      const listings = [];
      let stripHeader = false;
      const fetchSpy = async (input, init) => {
        const url = input instanceof Request ? input.url : String(input);
        if (new URL(url).pathname === "/v1/acp") listings.push(url);
        const res = await globalThis.fetch(input, init);
        if (!stripHeader || !res.headers.has("sandbox-agent-last-event-id")) return res;
        // What a daemon without the header answers.
        const headers = new Headers(res.headers);
        headers.delete("sandbox-agent-last-event-id");
        return new Response(res.body, { status: res.status, statusText: res.statusText, headers });
      };
      const events = [];
      const c = new SandboxAgentClient({
        baseUrl: proxy.url,
        agent: "mock",
        fetch: fetchSpy,
        onSessionUpdate: (e) => void events.push(e),
      });
      const { sessionId } = await c.newSession();
      const before = listings.length;
      assert.equal((await c.prompt({ sessionId, prompt: "/stream 50" })).stopReason, "end_turn");
      assert.equal(chunkTexts(events).length, 50, "every update before prompt() resolved");
      assert.equal(listings.length, before, "no GET /v1/acp: the answer named its last event");
      // Without the header (a daemon that does not send it) the SDK asks the listing instead.
      stripHeader = true;
      events.length = 0;
      assert.equal((await c.prompt({ sessionId, prompt: "/stream 30" })).stopReason, "end_turn");
      assert.equal(chunkTexts(events).length, 30);
      assert.equal(listings.length, before + 1, "one GET /v1/acp per prompt without the header");
      await c.disconnect();
    } finally {
      await proxy.close();
    }
  }));

test("a permission request is answered through onPermissionRequest", () =>
  withDaemon(async (d) => {
    const events = [];
    const asked = [];
    const c = new SandboxAgentClient({
      baseUrl: d.url,
      agent: "mock",
      onSessionUpdate: (e) => void events.push(e),
      onPermissionRequest: (req) => {
        asked.push(req);
        return req.options.find((o) => o.kind === "allow_always").optionId;
      },
    });
    const { sessionId } = await c.newSession();
    assert.equal((await c.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
    assert.equal(asked.length, 1);
    assert.equal(asked[0].sessionId, sessionId);
    assert.deepEqual(asked[0].options.map((o) => o.kind).sort(), ["allow_always", "allow_once", "reject_once"]);
    const chosen = asked[0].options.find((o) => o.kind === "allow_always").optionId;
    assert.ok(chunkTexts(events).some((t) => t.includes(chosen)), `a chunk names ${chosen}: ${chunkTexts(events)}`);
    await c.disconnect();
  }));

test("without onPermissionRequest the request is rejected, not left hanging", () =>
  withDaemon(async (d) => {
    const events = [];
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock", onSessionUpdate: (e) => void events.push(e) });
    const { sessionId } = await c.newSession();
    assert.equal((await c.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
    const texts = chunkTexts(events).join("\n");
    assert.match(texts, /reject/i, `the reject option was chosen: ${texts}`);
    await c.disconnect();
  }));

test("cancel() ends a hanging prompt with stopReason cancelled", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock" });
    const { sessionId } = await c.newSession();
    const running = c.prompt({ sessionId, prompt: "/hang" });
    // Cancel only once the daemon holds the prompt, so the cancel cannot overtake it.
    await eventually(async () => (await listed(d, c.serverId))?.pendingRequests === 1, { what: "prompt in flight" });
    await c.cancel(sessionId);
    assert.equal((await running).stopReason, "cancelled");
    // ACP's CancelNotification shape works the same.
    const again = c.prompt({ sessionId, prompt: "/hang" });
    await eventually(async () => (await listed(d, c.serverId))?.pendingRequests === 1, { what: "second prompt in flight" });
    await c.cancel({ sessionId });
    assert.equal((await again).stopReason, "cancelled");
    await assert.rejects(c.cancel(42), TypeError);
    await c.disconnect();
  }));

test("/crash 3 rejects the waiting prompt with exitCode 3 and the stderr tail", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock" });
    const { sessionId } = await c.newSession();
    await c.prompt({ sessionId, prompt: "/stderr the agent said this on stderr" });
    const e = await c.prompt({ sessionId, prompt: "/crash 3" }).catch((err) => err);
    assert.ok(e instanceof HttpError, `got ${e}`);
    assert.equal(e.status, 502);
    assert.equal(e.exitCode, 3);
    assert.match(e.stderrTail, /the agent said this on stderr/);
    await c.disconnect();
  }));

test("missing capabilities and unknown methods are clear errors", () =>
  withDaemon(async (d) => {
    const c = new SandboxAgentClient({ baseUrl: d.url, agent: "mock" });
    const { sessionId } = await c.newSession();
    // The mock advertises loadSession (it keeps its sessions in a file), but no session
    // list/fork/resume. `session/list` is answered by the daemon from its inventory.
    assert.deepEqual(await c.loadSession({ sessionId }), {});
    const listed = await c.listSessions();
    assert.deepEqual(listed.sessions.map((s) => s.sessionId), [sessionId]);
    for (const [name, call] of [
      ["forkSession", () => c.forkSession({ sessionId })],
      ["resumeSession", () => c.resumeSession({ sessionId })],
    ]) {
      const e = await call().catch((err) => err);
      assert.ok(e instanceof UnsupportedError, `${name}: ${e}`);
      assert.equal(e.method, name);
    }
    // Forwarded calls the mock does not implement: method not found from the agent.
    const e = await c.setSessionModel({ sessionId, modelId: "m" }).catch((err) => err);
    assert.ok(e instanceof UnsupportedError, `setSessionModel: ${e}`);
    const m = await c.setSessionMode({ sessionId, modeId: "m" }).catch((err) => err);
    assert.ok(m instanceof UnsupportedError || m instanceof AgentError, `setSessionMode: ${m}`);
    await c.disconnect();
  }));

test("session metadata is the client's: recorded, updated, and read back from a JSON file after a restart", () =>
  withDaemon(async (d) => {
    const dir = mkdtempSync(join(tmpdir(), "sdk-store-"));
    const file = join(dir, "sessions.json");
    try {
      const a = new SandboxAgentClient({ baseUrl: d.url, agent: "mock", sessionStore: new JsonFileSessionStore(file) });
      const { sessionId, record } = await a.newSession({ title: "first try", metadata: { ticket: 42 } });
      assert.equal(record.title, "first try");
      await a.prompt({ sessionId, prompt: "/stream 3" });
      await a.updateSession(sessionId, { title: "renamed" });
      const before = await a.sessions.get(a.serverId, sessionId);
      assert.equal(before.lastEventId, 3);
      // Leave the agent running, as a program that stops without cleaning up would.
      await a.disconnect({ stopAgent: false });

      // "After a restart": a fresh store over the same file, a fresh client attaching to the instance.
      const store = new JsonFileSessionStore(file);
      const [rec] = await store.list();
      assert.deepEqual(rec, before);
      assert.equal(rec.id, sessionId);
      assert.equal(rec.agent, "mock");
      assert.equal(rec.serverId, a.serverId);
      assert.equal(rec.title, "renamed");
      assert.deepEqual(rec.metadata, { ticket: 42 });
      assert.ok(Date.parse(rec.createdAt) <= Date.parse(rec.updatedAt));
      assert.equal(JSON.parse(readFileSync(file, "utf8")).sessions.length, 1);

      const events = [];
      const b = new SandboxAgentClient({
        baseUrl: d.url, agent: rec.agent, serverId: rec.serverId, lastEventId: rec.lastEventId,
        sessionStore: store, onSessionUpdate: (e) => void events.push(e),
      });
      await b.ready;
      // The session lives on in the agent; the stream resumes after the stored event id.
      await b.prompt({ sessionId: rec.id, prompt: "/stream 2" });
      assert.deepEqual(chunkTexts(events), ["chunk 1 of 2", "chunk 2 of 2"]);
      const after = await store.get(rec.serverId, rec.id);
      assert.ok(after.lastEventId > rec.lastEventId);
      await b.disconnect();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }));

test("onPermissionRequest may answer with ACP's own RequestPermissionResponse", () =>
  withDaemon(async (d) => {
    for (const [shape, make] of [
      ["selected outcome", (o) => ({ outcome: { outcome: "selected", optionId: o } })],
      ["{ optionId }", (o) => ({ optionId: o })],
      ["bare optionId", (o) => o],
    ]) {
      const events = [];
      const errors = [];
      const c = new SandboxAgentClient({
        baseUrl: d.url,
        agent: "mock",
        onSessionUpdate: (e) => void events.push(e),
        onError: (e) => void errors.push(e),
        onPermissionRequest: (req) => make(req.options.find((o) => o.kind === "allow_once").optionId),
      });
      const { sessionId } = await c.newSession();
      assert.equal((await c.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
      const texts = chunkTexts(events);
      assert.ok(texts.includes("permission: allow-once"), `${shape}: ${texts}`);
      assert.deepEqual(errors, [], shape);
      await c.disconnect();
    }
    // ACP's cancelled outcome is a cancel.
    const events = [];
    const c = new SandboxAgentClient({
      baseUrl: d.url,
      agent: "mock",
      onSessionUpdate: (e) => void events.push(e),
      onPermissionRequest: () => ({ outcome: { outcome: "cancelled" } }),
    });
    const { sessionId } = await c.newSession();
    await c.prompt({ sessionId, prompt: "/permission" });
    assert.ok(chunkTexts(events).includes("permission: cancelled"), `${chunkTexts(events)}`);
    await c.disconnect();
  }));

test("an unrecognised permission reply is an error for the caller, never a silent cancel", () =>
  withDaemon(async (d) => {
    for (const reply of [{ outcome: "selected", option: "allow-once" }, 42, "no-such-option", { outcome: { outcome: "maybe" } }]) {
      const events = [];
      const errors = [];
      const c = new SandboxAgentClient({
        baseUrl: d.url,
        agent: "mock",
        onSessionUpdate: (e) => void events.push(e),
        onError: (e) => void errors.push(e),
        onPermissionRequest: () => reply,
      });
      const { sessionId } = await c.newSession();
      assert.equal((await c.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
      assert.equal(errors.length, 1, `${JSON.stringify(reply)}: ${errors}`);
      assert.ok(errors[0] instanceof PermissionReplyError, `${errors[0]}`);
      assert.match(errors[0].message, /onPermissionRequest returned/);
      const texts = chunkTexts(events);
      // The mock reports a JSON-RPC error answer as "error"; a cancel would say "cancelled".
      assert.ok(texts.includes("permission: error"), `${JSON.stringify(reply)}: ${texts}`);
      await c.disconnect();
    }
  }));

test("a network error names the URL and the cause", async () => {
  const net = await import("node:net");
  const server = net.createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const port = server.address().port;
  await new Promise((r) => server.close(r));
  const c = new SandboxAgentClient({ baseUrl: `http://127.0.0.1:${port}`, agent: "mock", autoConnect: false });
  const e = await c.listAgents().catch((err) => err);
  assert.ok(e instanceof HttpError, `${e}`);
  assert.equal(e.status, 0);
  assert.ok(e.message.includes(`http://127.0.0.1:${port}/v1/agents`), e.message);
  assert.match(e.message, /ECONNREFUSED/);
  assert.ok(e.cause instanceof Error, "the fetch error is the cause");
  assert.equal(e.problem.url, `http://127.0.0.1:${port}/v1/agents`);
});
