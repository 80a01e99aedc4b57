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

/** Starts a daemon; resolves with { url, token, workDir, stop }. */
export async function startDaemon({ args = [], token } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "sdk-test-"));
  const workDir = join(dir, "work");
  const { mkdirSync } = await import("node:fs");
  mkdirSync(workDir);
  const full = ["server", "--port", "0", "--data-dir", join(dir, "data"), "--work-dir", workDir,
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
