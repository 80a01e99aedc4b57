// SandboxAgent.start({ sandbox }) with providers written here as plain objects (the interface is
// all a provider is) that run the real daemon binary as a local process: the create → start →
// health → connect steps, ensureServer after failed probes, getFetch-only providers, the typed
// step errors, and cleanup of a sandbox whose start failed. Engines are tested in
// test/providers/ (tests/it/providers.rs).
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { SandboxAgent, SandboxStartError, SandboxDetachedError } from "sandbox-agent";
import { SandboxAgent as LocalSandboxAgent } from "sandbox-agent/local";
import { startDaemon, binaryExists, BIN } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

/** A provider whose sandboxes are local daemons; `lazy` ones start only on ensureServer(). */
function processProvider({ token, lazy = false } = {}) {
  const daemons = new Map();
  const calls = [];
  let next = 0;
  const provider = {
    name: "proc",
    calls,
    daemons,
    async create() {
      const id = `p${++next}`;
      calls.push(["create", id]);
      daemons.set(id, lazy ? null : await startDaemon({ token }));
      return id;
    },
    async ensureServer(id) {
      calls.push(["ensureServer", id]);
      if (!daemons.get(id)) daemons.set(id, await startDaemon({ token }));
    },
    async reconnect(id) {
      calls.push(["reconnect", id]);
      if (!daemons.has(id)) throw new Error(`no sandbox ${id}`);
    },
    async getUrl(id) {
      calls.push(["getUrl", id]);
      // Before the daemon runs, a loopback port nothing listens on.
      return daemons.get(id)?.url ?? (await closedPortUrl());
    },
    async getToken() {
      return token;
    },
    async destroy(id) {
      calls.push(["destroy", id]);
      await daemons.get(id)?.stop();
      daemons.delete(id);
    },
    async kill(id) {
      calls.push(["kill", id]);
      await daemons.get(id)?.stop();
      daemons.delete(id);
    },
  };
  return provider;
}

async function closedPortUrl() {
  const s = createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return `http://127.0.0.1:${port}`;
}

test("start: create, health, connect; destroySandbox ends it; a second end is SandboxDetachedError", async () => {
  const p = processProvider({ token: "proc-token" });
  const events = [];
  const sa = await SandboxAgent.start({ sandbox: p, onSessionUpdate: (e) => void events.push(e) });
  assert.equal(sa.sandboxId, "proc/p1");
  assert.equal(sa.sandbox, p);
  assert.equal(sa.connected, true);
  const { sessionId } = await sa.newSession();
  assert.equal((await sa.prompt({ sessionId, prompt: "hello provider" })).stopReason, "end_turn");
  assert.equal(events.length > 0, true);
  assert.equal((await fetch(`${sa.baseUrl}/v1/health`)).status, 401, "the provider's token is in use");
  await sa.destroySandbox();
  assert.equal(p.daemons.size, 0);
  assert.equal(sa.sandboxId, undefined);
  await assert.rejects(sa.destroySandbox(), SandboxDetachedError);
  assert.deepEqual(p.calls.map((c) => c[0]), ["create", "getUrl", "destroy"]);
});

test("a daemon that is not running is started by ensureServer after failed probes, and its new URL is used", async () => {
  const p = processProvider({ lazy: true });
  const sa = await SandboxAgent.start({ sandbox: p, ensureServerAfter: 2, healthTimeoutMs: 60_000 });
  try {
    assert.equal((await sa.getHealth()).status, "ok");
    const names = p.calls.map((c) => c[0]);
    // getUrl before the server ran (a dead port), ensureServer after 2 failed probes, getUrl again.
    assert.deepEqual(names.slice(0, 4), ["create", "getUrl", "ensureServer", "getUrl"], JSON.stringify(p.calls));
    assert.equal(sa.baseUrl, p.daemons.get("p1").url);
  } finally {
    await sa.killSandbox();
  }
  assert.equal(p.daemons.size, 0, "killSandbox used the provider's kill");
  assert.equal(p.calls.at(-1)[0], "kill");
});

test("a URL that never answers ends at step health within healthTimeoutMs; the created sandbox is removed with kill", async () => {
  // The daemon runs, but the URL the provider gives never reaches it.
  const p = processProvider();
  const started = Date.now();
  const sandbox = { ...p, getUrl: closedPortUrl };
  const err = await SandboxAgent.start({ sandbox, healthTimeoutMs: 1_500, probeTimeoutMs: 500 }).catch((e) => e);
  assert.ok(err instanceof SandboxStartError, String(err));
  assert.equal(err.step, "health");
  assert.equal(err.sandboxId, "proc/p1");
  assert.match(err.message, /did not answer within 1500 ms/);
  assert.ok(err.cause instanceof Error, "the last probe's error");
  assert.ok(Date.now() - started < 10_000);
  // The sandbox start() created is removed again, with kill.
  assert.equal(p.calls.at(-1)[0], "kill");
  assert.equal(p.daemons.size, 0);
});

test("reconnect by sandboxId: reconnect and ensureServer first; dispose() leaves the sandbox", async () => {
  const p = processProvider({ token: "t2" });
  const first = await SandboxAgent.start({ sandbox: p });
  const id = first.sandboxId;
  await first.dispose();
  assert.equal(p.daemons.size, 1, "dispose() leaves it");
  p.calls.length = 0;
  const again = await SandboxAgent.start({ sandbox: p, sandboxId: id });
  assert.deepEqual(p.calls.map((c) => c[0]).slice(0, 2), ["reconnect", "ensureServer"]);
  assert.equal((await again.getHealth()).status, "ok");
  await again.destroySandbox();
  assert.equal(p.daemons.size, 0);
});

test("typed step errors: create, start, auth, connect; reconnect failures leave the sandbox alone", async () => {
  const boom = new Error("quota exceeded");
  const e1 = await SandboxAgent.start({ sandbox: { ...processProvider(), create: async () => Promise.reject(boom) } }).catch((e) => e);
  assert.ok(e1 instanceof SandboxStartError);
  assert.equal(e1.step, "create");
  assert.equal(e1.cause, boom, "the provider's own error");
  assert.equal(e1.sandboxId, undefined);

  const p = processProvider();
  const e2 = await SandboxAgent.start({ sandbox: { ...p, getUrl: async () => Promise.reject(new Error("no route")) } }).catch((e) => e);
  assert.equal(e2.step, "start");
  assert.match(e2.message, /no route/);
  assert.equal(p.daemons.size, 0, "the created sandbox was removed");

  const q = processProvider({ token: "right" });
  const e3 = await SandboxAgent.start({ sandbox: q, token: "wrong" }).catch((e) => e);
  assert.equal(e3.step, "auth");
  assert.match(e3.cause.message, /401/);
  assert.equal(q.daemons.size, 0);

  const r = processProvider();
  const e4 = await SandboxAgent.start({ sandbox: r, agent: "no-such-agent" }).catch((e) => e);
  assert.equal(e4.step, "connect");
  assert.equal(r.daemons.size, 0);

  const s = processProvider();
  const e5 = await SandboxAgent.start({ sandbox: s, sandboxId: "proc/unknown" }).catch((e) => e);
  assert.equal(e5.step, "start");
  assert.match(e5.message, /no sandbox unknown/);
  assert.deepEqual(s.calls.map((c) => c[0]), ["reconnect"], "nothing created, nothing destroyed");

  await assert.rejects(SandboxAgent.start({ sandbox: processProvider(), sandboxId: "other/x" }), TypeError);
  await assert.rejects(SandboxAgent.start({ sandbox: processProvider(), sandboxId: "no-slash" }), TypeError);
  await assert.rejects(SandboxAgent.start({ sandbox: { name: "x", create: async () => "1", destroy: async () => {} } }), TypeError);
});

test("a getFetch-only provider is reached through its fetch; pauseSandbox falls back to destroy", async () => {
  const d = await startDaemon();
  let routed = 0;
  let destroyed = 0;
  const provider = {
    name: "fetchonly",
    create: async () => "one",
    destroy: async () => void destroyed++,
    getFetch: async () => (input, init) => {
      routed++;
      const url = new URL(input instanceof Request ? input.url : String(input));
      return fetch(`${d.url}${url.pathname}${url.search}`, init);
    },
  };
  try {
    const sa = await SandboxAgent.start({ sandbox: provider });
    assert.equal((await sa.getHealth()).status, "ok");
    const { sessionId } = await sa.newSession();
    assert.equal((await sa.prompt({ sessionId, prompt: "via fetch" })).stopReason, "end_turn");
    assert.ok(routed > 3, `requests went through the provider's fetch (${routed})`);
    await sa.pauseSandbox();
    assert.equal(destroyed, 1);
  } finally {
    await d.stop();
  }
});

test("an aborted start rejects with the abort reason and removes what it created", async () => {
  const p = processProvider({ lazy: true });
  const ac = new AbortController();
  const reason = new Error("user gave up");
  setTimeout(() => ac.abort(reason), 300);
  const err = await SandboxAgent.start({ sandbox: { ...p, ensureServer: undefined }, signal: ac.signal }).catch((e) => e);
  assert.equal(err, reason);
  assert.equal(p.calls.at(-1)[0], "kill");
});

test("sandbox-agent/local's SandboxAgent.start() takes a provider too", async () => {
  const p = processProvider();
  const sa = await LocalSandboxAgent.start({ sandbox: p });
  assert.equal(sa.sandboxId, "proc/p1");
  await sa.destroySandbox();
  assert.equal(p.daemons.size, 0);
});

test("the docker and kubernetes providers load their engine clients; an unreachable engine fails at step create", async () => {
  const { docker } = await import("sandbox-agent/docker");
  const e1 = await SandboxAgent.start({ sandbox: docker({ socketPath: "/nonexistent/docker.sock" }) }).catch((e) => e);
  assert.ok(e1 instanceof SandboxStartError, String(e1));
  assert.equal(e1.step, "create");
  assert.equal(e1.provider, "docker");
  assert.equal(e1.cause.code, "ENOENT", `the socket's own error: ${e1.cause}`);

  const k8s = await import("@kubernetes/client-node");
  const { kubernetes } = await import("sandbox-agent/kubernetes");
  const kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "c", server: await closedPortUrl(), skipTLSVerify: true }],
    users: [{ name: "u", token: "t" }],
    contexts: [{ name: "x", cluster: "c", user: "u", namespace: "team-a" }],
    currentContext: "x",
  });
  const provider = kubernetes({ kubeConfig: kc });
  assert.equal(await provider.namespace, "team-a", "the context's namespace");
  const e2 = await SandboxAgent.start({ sandbox: provider }).catch((e) => e);
  assert.ok(e2 instanceof SandboxStartError, String(e2));
  assert.equal(e2.step, "create");
  assert.equal(e2.provider, "kubernetes");
  assert.match(String(e2.cause?.message ?? e2.cause), /ECONNREFUSED|connect|fetch failed/i);
  await provider.close();
});
