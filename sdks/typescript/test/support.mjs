// Test support: starts the real daemon binary on 127.0.0.1:0 and stops it.
// The binary comes from SANDBOX_AGENT_BIN (default: the workspace's cargo debug build).
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const BIN = resolve(process.env.SANDBOX_AGENT_BIN ?? join(here, "../../../target/debug/sandbox-agent"));

export function binaryExists() {
  return existsSync(BIN);
}

/**
 * Starts a daemon; resolves with { url, token, workDir, stop }. `workDir` and `port` let a test
 * start a daemon again where the last one was (a restart on the same state dir).
 */
export async function startDaemon({ args = [], token, workDir: work, port = 0 } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "sdk-test-"));
  const workDir = work ?? join(dir, "work");
  const { mkdirSync } = await import("node:fs");
  mkdirSync(workDir, { recursive: true });
  const full = ["server", "--port", String(port), "--data-dir", join(dir, "data"), "--work-dir", workDir,
    "--log-format", "text", ...(token ? ["--token", token] : []), ...args];
  const child = spawn(BIN, full, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`daemon did not start in 20 s:\n${stderr}`)), 20_000);
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      if (stderr.length < 1 << 20) stderr += chunk;
      const m = /listening on (http:\/\/[^\s]+)/.exec(stderr);
      if (m) {
        clearTimeout(timer);
        resolveUrl(m[1]);
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`daemon exited with ${code}:\n${stderr}`));
    });
  });
  child.removeAllListeners("exit");
  const exited = new Promise((r) => child.on("exit", (code, signal) => r({ code, signal })));
  return {
    url,
    token,
    workDir,
    dir,
    child,
    stderr: () => stderr,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const killer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      const status = await exited;
      clearTimeout(killer);
      rmSync(dir, { recursive: true, force: true });
      return status;
    },
  };
}

/** Polls `check` until it returns a truthy value or `timeoutMs` passes. */
export async function eventually(check, { timeoutMs = 10_000, intervalMs = 20, what = "condition" } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${last}` : ""}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** Skips a test, or fails it when SANDBOX_AGENT_TESTS_STRICT is set (CI must run everything). */
export function skipOrFail(t, reason) {
  if (process.env.SANDBOX_AGENT_TESTS_STRICT && process.env.SANDBOX_AGENT_TESTS_STRICT !== "0") {
    throw new Error(`SKIPPED under SANDBOX_AGENT_TESTS_STRICT: ${reason}`);
  }
  t.skip(reason);
}

/**
 * A loopback TCP proxy in front of the daemon, so a test can cut or hold the event stream's socket
 * the way a flaky network would.
 * - `cutSseAfterBytes`: the first SSE response is cut (both sockets destroyed) once this many bytes
 *   of it went through.
 * - `holdSse(true)`: new `GET /v1/acp/…` requests are held (not forwarded) until `holdSse(false)`.
 * - `cutSse()`: destroys every connection currently carrying an event stream.
 * - `delaySseMs`: event-stream bytes are forwarded this much later (in order), like a slow path.
 * - `sseRequests`: the request heads of every event-stream GET seen.
 */
export async function startProxy(targetUrl, { cutSseAfterBytes, delaySseMs = 0 } = {}) {
  const net = await import("node:net");
  const target = new URL(targetUrl);
  const conns = new Set();
  const sseRequests = [];
  const postRequests = [];
  let holding = false;
  let cutDone = cutSseAfterBytes === undefined;
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    const c = { client, upstream, sse: false, sseBytes: 0, held: null };
    conns.add(c);
    const close = () => {
      conns.delete(c);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close);
    upstream.on("error", close);
    client.on("close", close);
    upstream.on("close", close);
    client.on("data", (d) => {
      const head = d.toString("latin1", 0, Math.min(d.length, 4096));
      if (head.startsWith("GET /v1/acp/") && /accept: text\/event-stream/i.test(head)) {
        sseRequests.push(head);
        if (holding) c.held = [];
      }
      if (head.startsWith("POST /v1/acp/")) postRequests.push(head.split("\r\n\r\n")[0]);
      if (c.held) c.held.push(d);
      else upstream.write(d);
    });
    upstream.on("data", (d) => {
      const head = d.toString("latin1", 0, Math.min(d.length, 4096));
      // An event stream, or a WebSocket (101): the long-lived connections a test may cut.
      if (!c.sse && (/content-type: text\/event-stream/i.test(head) || head.startsWith("HTTP/1.1 101"))) {
        c.sse = true;
      }
      if (c.sse && !cutDone) {
        const room = cutSseAfterBytes - c.sseBytes;
        if (d.length >= room) {
          cutDone = true;
          client.write(d.subarray(0, room), () => close());
          return;
        }
        c.sseBytes += d.length;
      }
      if (c.sse && delaySseMs > 0) setTimeout(() => client.writable && client.write(d), delaySseMs);
      else client.write(d);
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    sseRequests,
    postRequests,
    holdSse(on) {
      holding = on;
      if (!on) {
        for (const c of conns) {
          if (c.held) {
            for (const d of c.held) c.upstream.write(d);
            c.held = null;
          }
        }
      }
    },
    cutSse() {
      for (const c of conns) if (c.sse) {
        c.client.destroy();
        c.upstream.destroy();
      }
    },
    async close() {
      for (const c of conns) {
        c.client.destroy();
        c.upstream.destroy();
      }
      await new Promise((r) => server.close(r));
    },
  };
}

/** Text of every `agent_message_chunk` update, in arrival order. */
export function chunkTexts(events) {
  return events.filter((e) => e.update?.sessionUpdate === "agent_message_chunk").map((e) => e.update.content.text);
}
