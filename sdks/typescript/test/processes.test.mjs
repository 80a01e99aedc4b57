// The SDK's process methods against the real daemon (docs/processes.md): run with exit codes and a
// timeout, a followed log cut and resumed with nothing lost or repeated, a gap, stdin through `cat`,
// a PTY bash over the terminal WebSocket (with the token in a header and in the URL), stop of a tree,
// and problem errors. Every call is made on a client that never connected (host APIs).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import WS from "ws";
import { SandboxAgentClient, HttpError } from "sandbox-agent";
import { startDaemon, startProxy, eventually, binaryExists, BIN, skipOrFail } from "./support.mjs";

const TOKEN = "proc-tok";
// Node 20 has no global WebSocket (22 has); `ws` takes the same constructor forms. The terminal
// tests pass none, so the SDK finds one itself (the global one, else the installed `ws`).
const WebSocket = globalThis.WebSocket ?? WS;
const text = (entries) => Buffer.concat(entries.map((e) => Buffer.from(e.data, "base64"))).toString();

let d;
let c;
before(async () => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
  d = await startDaemon({ token: TOKEN });
  c = new SandboxAgentClient({ baseUrl: d.url, token: TOKEN, agent: "mock", autoConnect: false });
});
after(async () => {
  await d?.stop();
});

/** Entries must tile the byte offsets: each starts where the one before ended (none lost or repeated). */
function assertContiguous(entries, from = 0) {
  let at = from;
  for (const e of entries) {
    const len = Buffer.from(e.data, "base64").length;
    assert.equal(e.sequence - len, at, `entry ending at ${e.sequence} (${len} bytes) does not start at ${at}`);
    at = e.sequence;
  }
  return at;
}

async function waitExited(id) {
  return eventually(async () => {
    const p = await c.getProcess(id);
    return p.status === "exited" ? p : null;
  }, { what: `${id} to exit` });
}

test("runProcess: exit codes 0 and 3, output, and a timeout that kills", async () => {
  const ok = await c.runProcess({ command: "sh", args: ["-c", "echo hi"] });
  assert.equal(ok.exitCode, 0);
  assert.equal(ok.stdout, "hi\n");
  assert.equal(ok.timedOut, false);
  const three = await c.runProcess({ command: "sh", args: ["-c", "echo out; echo err >&2; exit 3"] });
  assert.equal(three.exitCode, 3);
  assert.equal(three.stdout, "out\n");
  assert.equal(three.stderr, "err\n");
  const slow = await c.runProcess({ command: "sleep", args: ["30"], timeoutMs: 300 });
  assert.equal(slow.timedOut, true);
  assert.equal(slow.exitCode ?? null, null);
  assert.ok(slow.durationMs < 10_000, `the timeout ended it (${slow.durationMs} ms)`);
});

test("followProcessLogs: the stream is cut three times and resumed with Last-Event-ID; nothing lost or repeated", async () => {
  // The first event stream is cut after 3000 bytes; two more cuts come from the test while it runs.
  const proxy = await startProxy(d.url, { cutSseAfterBytes: 3000 });
  const via = new SandboxAgentClient({ baseUrl: proxy.url, token: TOKEN, agent: "mock", autoConnect: false });
  try {
    const N = 400;
    const p = await via.createProcess({
      command: "sh",
      args: ["-c", `i=1; while [ $i -le ${N} ]; do echo "line $i"; i=$((i+1)); sleep 0.005; done`],
    });
    const entries = [];
    const gaps = [];
    const sub = await via.followProcessLogs(p.id, (e) => entries.push(e), {}, {
      onGap: (g) => gaps.push(g), reconnectInitialMs: 20,
    });
    await eventually(() => sub.reconnects >= 1 && entries.length > 0, { what: "the first cut and resume" });
    const afterFirst = entries.length;
    await eventually(() => entries.length > afterFirst + 5, { what: "more output after the first resume" });
    proxy.cutSse();
    const afterSecond = entries.length;
    await eventually(() => entries.length > afterSecond + 5, { what: "more output after the second cut" });
    proxy.cutSse();
    await sub.closed; // resolves once the process exited and everything was delivered
    assert.ok(sub.reconnects >= 3, `resumed ${sub.reconnects} times`);
    assert.deepEqual(gaps, []);
    const expected = Array.from({ length: N }, (_, i) => `line ${i + 1}\n`).join("");
    assert.equal(text(entries), expected);
    const end = assertContiguous(entries);
    assert.equal(end, expected.length);
    assert.equal(sub.lastSequence, end);
    assert.equal((await via.getProcess(p.id)).status, "exited");
  } finally {
    await proxy.close();
  }
});

test("followProcessLogs reports dropped output as a gap with the exact range, then the rest", async () => {
  const config = await c.getProcessConfig();
  await c.setProcessConfig({ ...config, maxLogBytesPerProcess: 16 * 1024 });
  try {
    // 200 KB of output into a 16 KiB log: the oldest chunks are dropped before anyone reads.
    const p = await c.createProcess({ command: "head", args: ["-c", "200000", "/dev/zero"] });
    await waitExited(p.id);
    const entries = [];
    const gaps = [];
    const sub = await c.followProcessLogs(p.id, (e) => entries.push(e), {}, { onGap: (g) => gaps.push(g) });
    await sub.closed;
    assert.equal(gaps.length, 1, JSON.stringify(gaps));
    assert.equal(gaps[0].from, 0);
    assert.ok(gaps[0].to > 0 && gaps[0].to < 200000, JSON.stringify(gaps[0]));
    // What follows the gap is exactly the retained tail, up to the end.
    assert.equal(assertContiguous(entries, gaps[0].to), 200000);
    const page = await c.getProcessLogs(p.id);
    assert.deepEqual(page.gap, gaps[0]);
  } finally {
    await c.setProcessConfig(config);
  }
});

test("sendProcessInput: a stdin round trip through cat (base64 and utf8), followed live", async () => {
  const p = await c.createProcess({ command: "cat", interactive: true });
  assert.equal(p.status, "running");
  const entries = [];
  const sub = await c.followProcessLogs(p.id, (e) => entries.push(e));
  const sent = await c.sendProcessInput(p.id, { data: Buffer.from("ping\n").toString("base64") });
  assert.equal(sent.bytesWritten, 5);
  await c.sendProcessInput(p.id, { data: "pong ü\n", encoding: "utf8" });
  await eventually(() => text(entries) === "ping\npong ü\n", { what: "cat's echo" });
  assert.deepEqual((await c.listProcesses()).processes.filter((x) => x.id === p.id).map((x) => x.status), ["running"]);
  const stopped = await c.stopProcess(p.id, { waitMs: 10_000 });
  assert.equal(stopped.status, "exited");
  await sub.closed;
  assert.equal(text((await c.getProcessLogs(p.id, { stream: "stdout" })).entries), "ping\npong ü\n");
  await c.deleteProcess(p.id);
  await assert.rejects(c.getProcess(p.id), (e) => e instanceof HttpError && e.status === 404);
});

/** Opens a bash on a terminal and its WebSocket session; collects the output as text. */
async function terminal(client, options) {
  const p = await client.createProcess({
    command: "bash", args: ["--norc", "--noprofile"], tty: true, interactive: true, env: { PS1: "$ " },
  });
  const session = client.connectProcessTerminal(p.id, options);
  const out = { text: "" };
  const decoder = new TextDecoder();
  session.onData((bytes) => {
    out.text += decoder.decode(bytes, { stream: true });
  });
  const ready = await session.ready;
  assert.equal(ready.processId, p.id);
  return { p, session, out };
}

for (const tokenIn of ["header", "query"]) {
  test(`terminal WebSocket (token in the ${tokenIn}): bash answers tty with a pty, sees a resize, exits`, async () => {
    const { p, session, out } = await terminal(c, { tokenIn });
    const exits = [];
    session.onExit((f) => exits.push(f));
    session.sendInput("tty\n");
    await eventually(() => /\/dev\/pts\/\d+/.test(out.text), { what: "a pty path from tty" });
    session.resize({ cols: 123, rows: 45 });
    // Bytes input (sent as base64) works the same as text.
    session.sendInput(new TextEncoder().encode("stty size\n"));
    await eventually(() => out.text.includes("45 123"), { what: "stty size to see the resize" });
    session.sendInput("exit 7\n");
    await session.closed;
    assert.deepEqual(exits.map((f) => f.exitCode), [7]);
    const done = await waitExited(p.id);
    assert.equal(done.exitCode, 7);
  });
}

test("terminal WebSocket: a wrong token, an unknown process and a process without a terminal are refused with their problem", async () => {
  const wrong = new SandboxAgentClient({ baseUrl: d.url, token: "not-it", agent: "mock", autoConnect: false });
  for (const tokenIn of ["header", "query"]) {
    const s = wrong.connectProcessTerminal("proc_1", { WebSocket, tokenIn }); // passed explicitly
    await assert.rejects(s.ready, (e) => e instanceof HttpError && e.status === 401, tokenIn);
  }
  const s404 = c.connectProcessTerminal("proc_999999", { WebSocket });
  await assert.rejects(s404.ready, (e) => e instanceof HttpError && e.status === 404);
  const plain = await c.createProcess({ command: "sleep", args: ["30"] });
  const s409 = c.connectProcessTerminal(plain.id, { WebSocket });
  await assert.rejects(s409.ready, (e) => e instanceof HttpError && e.status === 409);
  await c.killProcess(plain.id, { waitMs: 10_000 });
});

test("stopProcess takes the whole tree, a TERM-ignoring setsid grandchild included", async (t) => {
  if (process.getuid?.() !== 0) return skipOrFail(t, "needs root for cgroups (a setsid grandchild leaves the process group)");
  const script = `sleep 1000 & echo "child $!"; setsid sh -c 'trap "" TERM; echo "grandchild $$"; exec sleep 1000' & wait`;
  const p = await c.createProcess({ command: "sh", args: ["-c", script] });
  const pids = await eventually(async () => {
    const t = text((await c.getProcessLogs(p.id)).entries);
    const m = [...t.matchAll(/(child|grandchild) (\d+)/g)].map((x) => Number(x[2]));
    return m.length === 2 ? m : null;
  }, { what: "the tree's pids" });
  const alive = (pid) => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  assert.ok(pids.every(alive), "the tree runs");
  const stopped = await c.stopProcess(p.id, { waitMs: 20_000 });
  assert.equal(stopped.status, "exited");
  await eventually(() => !pids.some(alive), { what: "every process of the tree to be gone" });
});

test("problems: 404 for an unknown id, 409 deleting a running process, 429 over the process cap", async () => {
  for (const call of [() => c.getProcess("proc_999999"), () => c.getProcessLogs("proc_999999"),
    () => c.stopProcess("proc_999999"), () => c.deleteProcess("proc_999999"),
    () => c.followProcessLogs("proc_999999", () => {})]) {
    await assert.rejects(call(), (e) => e instanceof HttpError && e.status === 404 && e.problem.status === 404);
  }
  const config = await c.getProcessConfig();
  const running = (await c.listProcesses()).processes.filter((p) => p.status === "running").length;
  await c.setProcessConfig({ ...config, maxConcurrentProcesses: running + 1 });
  const sleeper = await c.createProcess({ command: "sleep", args: ["30"] });
  try {
    await assert.rejects(c.createProcess({ command: "true" }), (e) => e instanceof HttpError && e.status === 429);
    await assert.rejects(c.runProcess({ command: "true" }), (e) => e instanceof HttpError && e.status === 429);
    await assert.rejects(c.deleteProcess(sleeper.id), (e) => e instanceof HttpError && e.status === 409);
  } finally {
    await c.setProcessConfig(config);
    await c.killProcess(sleeper.id, { waitMs: 10_000 });
  }
  await c.deleteProcess(sleeper.id);
  await assert.rejects(c.createProcess({ command: "/nonexistent/program" }), (e) => e instanceof HttpError && e.status === 400);
});
