// Starts the daemon under test (SANDBOX_AGENT_BIN) on a free loopback port with a token, in
// private data and work directories; `stop()` ends it with SIGTERM and removes them.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export async function startDaemon() {
  const bin = process.env.SANDBOX_AGENT_BIN;
  if (!bin) throw new Error("SANDBOX_AGENT_BIN names the binary under test");
  const dir = mkdtempSync(join(tmpdir(), "oc-sdk-"));
  const token = randomBytes(16).toString("hex");
  const port = await freePort();
  const child = spawn(
    bin,
    ["server", "--host", "127.0.0.1", "--port", String(port), "--token", token,
      "--data-dir", join(dir, "data"), "--work-dir", dir],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr.on("data", (c) => { stderr += c; });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the daemon exited: ${stderr}`);
    try {
      const r = await fetch(`${base}/v1/health`, { headers: { authorization: `Bearer ${token}` } });
      if (r.ok) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`the daemon did not answer: ${stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const basic = "Basic " + Buffer.from(`opencode:${token}`).toString("base64");
  return {
    url: `${base}/opencode`,
    headers: { authorization: basic },
    async stop() {
      child.kill("SIGTERM");
      await new Promise((r) => (child.exitCode !== null ? r() : child.once("exit", r)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/// Reads an SDK event stream in the background; `until(pred)` resolves with the first event
/// (seen before or after the call) that matches.
export function collect(stream) {
  const seen = [];
  const waiters = [];
  (async () => {
    try {
      for await (const ev of stream) {
        seen.push(ev);
        for (const w of [...waiters]) {
          if (w.pred(ev)) {
            waiters.splice(waiters.indexOf(w), 1);
            w.resolve(ev);
          }
        }
      }
    } catch {}
  })();
  return {
    seen,
    until(pred, ms = 20_000) {
      const hit = seen.find(pred);
      if (hit) return Promise.resolve(hit);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`no matching event; seen ${JSON.stringify(seen.map((e) => e.type ?? e.payload?.type))}`)),
          ms,
        );
        waiters.push({ pred, resolve: (ev) => { clearTimeout(timer); resolve(ev); } });
      });
    },
  };
}

export const textOf = (msg) =>
  (msg?.parts ?? []).filter((p) => p.type === "text").map((p) => p.text).join("");
