// Local mode: SandboxAgent.start() runs the daemon binary, returns a connected client, and
// dispose() stops the daemon.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SandboxAgent } from "sandbox-agent/local";
import { HttpError } from "sandbox-agent";
import { binaryExists, BIN, eventually } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test("start() runs a daemon and connects; dispose() stops it", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sdk-local-"));
  try {
    const events = [];
    const sa = await SandboxAgent.start({
      binaryPath: BIN,
      token: "local-token",
      args: ["--data-dir", join(dir, "data"), "--work-dir", dir],
      onSessionUpdate: (e) => void events.push(e.update.content.text),
    });
    const pid = sa.pid;
    assert.ok(pid > 0);
    assert.equal(sa.connected, true);
    const health = await sa.getHealth();
    assert.equal(health.status, "ok");
    assert.equal(health.dataDir.writable, true);
    const { sessionId } = await sa.newSession();
    assert.equal((await sa.prompt({ sessionId, prompt: "hello local" })).stopReason, "end_turn");
    assert.deepEqual(events, ["hello local"]);
    // The daemon really requires the token it was given.
    assert.equal((await fetch(`${sa.baseUrl}/v1/health`)).status, 401);
    await sa.dispose();
    await eventually(() => !alive(pid), { what: "the daemon to exit" });
    await assert.rejects(sa.getHealth(), HttpError, "nothing answers after dispose()");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("start() with a missing binary fails with a clear error", async () => {
  await assert.rejects(
    SandboxAgent.start({ binaryPath: "/nonexistent/sandbox-agent", startTimeoutMs: 5000 }),
    /sandbox-agent did not start/,
  );
});
