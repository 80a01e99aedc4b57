// Session bundles through the SDK: exportSession streams a bundle out of daemon A, importSession
// streams it into daemon B (another state dir and work dir, a cwd mapping), and the same
// session continues there: the mock agent, restored with session/load, remembers the codeword.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AcpHttpClient } from "acp-http-client";
import { HostApi, HttpError } from "sandbox-agent";
import { startDaemon, eventually, binaryExists, BIN } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

const text = (t) => [{ type: "text", text: t }];

test("exportSession and importSession move a session between daemons as streams", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sdk-bundle-"));
  const workA = join(dir, "a-work");
  const workB = join(dir, "b-work");
  const a = await startDaemon({ args: ["--state-dir", join(dir, "a-state")], workDir: workA });
  const b = await startDaemon({ args: ["--state-dir", join(dir, "b-state")], workDir: workB });
  const ca = new AcpHttpClient({ baseUrl: a.url, serverId: "moving", agent: "mock", client: { sessionUpdate: () => {} } });
  const updates = [];
  const cb = new AcpHttpClient({
    baseUrl: b.url,
    serverId: "moving",
    client: { sessionUpdate: (n) => void updates.push(n.update.content?.text ?? n.update.sessionUpdate) },
  });
  try {
    await ca.initialize();
    const { sessionId } = await ca.newSession({ cwd: workA, mcpServers: [] });
    assert.equal((await ca.prompt({ sessionId, prompt: text("codeword FIG-3") })).stopReason, "end_turn");

    const hostA = new HostApi({ baseUrl: a.url });
    const hostB = new HostApi({ baseUrl: b.url });
    const stream = await hostA.exportSession("moving");
    assert.ok(stream instanceof ReadableStream);
    const done = await hostB.importSession("moving", stream, { cwd: { [workA]: workB } });
    assert.deepEqual(done.sessions, [sessionId]);
    assert.equal(done.agent, "mock");

    // The same again is a conflict, as an HttpError with the problem.
    await assert.rejects(
      async () => hostB.importSession("moving", await hostA.exportSession("moving")),
      (e) => e instanceof HttpError && e.status === 409,
    );

    const answer = await cb.prompt({ sessionId, prompt: text("/history") });
    assert.equal(answer.stopReason, "end_turn");
    await eventually(() => updates.includes("history: codeword FIG-3"), { what: "the imported session's history" });
  } finally {
    await ca.close().catch(() => {});
    await cb.close().catch(() => {});
    await a.stop();
    await b.stop();
  }
});
