// Each package README's quickstart runs verbatim (the first ```js block after "## Quickstart"),
// against a daemon whose address is handed over in SANDBOX_AGENT_URL, as the quickstart reads it.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { startDaemon, binaryExists, BIN } from "./support.mjs";

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), "..");

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

function quickstart(pkg) {
  const md = readFileSync(join(root, "packages", pkg, "README.md"), "utf8");
  const m = /## Quickstart[\s\S]*?```js\n([\s\S]*?)```/.exec(md);
  assert.ok(m, `${pkg}/README.md has a js quickstart`);
  return m[1];
}

async function runQuickstart(pkg) {
  const d = await startDaemon();
  // Inside the workspace, so `import "sandbox-agent"` resolves to the packages built here.
  const file = join(root, `.quickstart-${pkg}-${process.pid}.mjs`);
  writeFileSync(file, quickstart(pkg));
  try {
    const { stdout } = await run(process.execPath, [file], {
      env: { ...process.env, SANDBOX_AGENT_URL: d.url },
      timeout: 60_000,
    });
    return stdout;
  } finally {
    rmSync(file, { force: true });
    await d.stop();
  }
}

test("sandbox-agent README quickstart runs verbatim and prints what it says", async () => {
  const out = await runQuickstart("sandbox-agent");
  assert.equal(out, "agent: chunk 1 of 3\nagent: chunk 2 of 3\nagent: chunk 3 of 3\nstop reason: end_turn\nprocess: hello 0\n");
});

test("acp-http-client README quickstart runs verbatim and prints what it says", async () => {
  const out = await runQuickstart("acp-http-client");
  const lines = out.trim().split("\n");
  assert.equal(lines[0], "agent: mock");
  assert.deepEqual(lines.slice(1).sort(), ["stop reason: end_turn", "update: agent_message_chunk hello"]);
});
