// Each package README's quickstart runs verbatim (the first ```js block after "## Quickstart"),
// against a daemon whose address is handed over in SANDBOX_AGENT_URL, as the quickstart reads it.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { readFileSync, writeFileSync, rmSync, mkdtempSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
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

/** The ```sh block right after the heading `## <title>` in the sandbox-agent README. */
function shBlock(title) {
  const md = readFileSync(join(root, "packages", "sandbox-agent", "README.md"), "utf8");
  const m = new RegExp(`## ${title}\\n[\\s\\S]*?\`\`\`sh\\n([\\s\\S]*?)\`\`\``).exec(md);
  assert.ok(m, `README has a sh block under "${title}"`);
  return m[1];
}

// "Install" then "Use it from your own project", as a user outside this workspace does them:
// `npm pack` here (the `npm ci && npm run build` line of the block already ran: this suite
// runs after `npm run build`), then the project steps verbatim in an empty directory — only
// `SDK=` points at this checkout — and the quickstart from there, resolving `sandbox-agent` from
// the installed tarballs, not from the workspace.
test("the README's install and own-project steps work as written outside the workspace", async () => {
  const install = shBlock("Install").split("\n").filter((l) => l.startsWith("npm pack"));
  assert.equal(install.length, 1, "the install block packs the two tarballs");
  const version = JSON.parse(readFileSync(join(root, "packages", "sandbox-agent", "package.json"), "utf8")).version;
  await run("sh", ["-c", install[0]], { cwd: root, timeout: 120_000 });
  const project = shBlock("Use it from your own project");
  assert.match(project, new RegExp(`sandbox-agent-${version.replace(/\./g, "\\.")}\\.tgz`), "the README names this version's tarball");
  const script = project.replace(/^SDK=.*$/m, `SDK='${root}'`);
  assert.notEqual(script, project, "the block starts by setting SDK=");
  const home = mkdtempSync(join(tmpdir(), "sdk-own-project-"));
  const d = await startDaemon();
  try {
    await run("sh", ["-ec", script], { cwd: home, timeout: 300_000, env: { ...process.env, npm_config_prefer_offline: "true", npm_config_audit: "false", npm_config_fund: "false" } });
    const app = join(home, "my-agent-app");
    writeFileSync(join(app, "quickstart.mjs"), quickstart("sandbox-agent"));
    const { stdout } = await run(process.execPath, ["quickstart.mjs"], {
      cwd: app,
      env: { ...process.env, SANDBOX_AGENT_URL: d.url },
      timeout: 60_000,
    });
    assert.equal(stdout, "agent: chunk 1 of 3\nagent: chunk 2 of 3\nagent: chunk 3 of 3\nstop reason: end_turn\nprocess: hello 0\n");
    // It ran our package from the project's node_modules, not the workspace's.
    const installed = JSON.parse(readFileSync(join(app, "node_modules", "sandbox-agent", "package.json"), "utf8"));
    assert.equal(installed.version, version);
    assert.ok(existsSync(join(app, "node_modules", "acp-http-client", "dist", "index.js")));
  } finally {
    await d.stop();
    rmSync(home, { recursive: true, force: true });
  }
});
