// The workspace API through the SDK against the real daemon: git status/diff/commit/worktrees on a
// repository built here, grep and glob, the listening ports, and a preview link that works
// without the token.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { SandboxAgentClient, HttpError } from "sandbox-agent";
import { startDaemon } from "./support.mjs";

function git(cwd, ...args) {
  return execFileSync(
    "git",
    ["-c", "user.name=T", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main", ...args],
    { cwd, env: { ...process.env, GIT_CONFIG_GLOBAL: "/dev/null", GIT_CONFIG_NOSYSTEM: "1" } },
  )
    .toString()
    .trim();
}

test("git, search, ports and a preview link through the SDK", async () => {
  const d = await startDaemon({ token: "tok" });
  const c = new SandboxAgentClient({ baseUrl: d.url, token: "tok", agent: "mock", autoConnect: false });
  const server = createServer((req, res) => res.end(`app saw ${req.url} auth=${req.headers.authorization ?? "none"}`));
  try {
    const repo = join(d.workDir, "repo");
    mkdirSync(repo);
    git(repo, "init", "-q");
    writeFileSync(join(repo, "a.txt"), "one\n");
    git(repo, "add", "-A");
    git(repo, "commit", "-qm", "first");
    const head = git(repo, "rev-parse", "HEAD");
    writeFileSync(join(repo, "a.txt"), "one\ntwo needle\n");

    const st = await c.gitStatus(repo);
    assert.equal(st.branch, "main");
    assert.deepEqual(st.files.map((f) => [f.path, f.status, f.staged]), [["a.txt", "modified", false]]);
    const diff = await c.gitDiff(repo);
    assert.equal(diff.base, head);
    assert.equal(diff.files[0].additions, 1);
    assert.match(diff.files[0].patch, /\+two needle/);
    const { sha } = await c.gitCommit({ path: repo, message: "second", all: true });
    assert.equal((await c.gitLog(repo)).commits[0].sha, sha);
    await assert.rejects(c.gitCommit({ path: repo, message: "empty" }), (e) => e instanceof HttpError && e.status === 409);
    const wt = await c.addWorktree({ path: repo, dest: join(d.workDir, "wt"), branch: "agent" });
    assert.equal(wt.branch, "agent");
    assert.equal((await c.listWorktrees(repo)).length, 2);
    await c.removeWorktree(wt.path);

    const g = await c.grep({ path: repo, pattern: "needle" });
    assert.deepEqual(g.matches.map((m) => [m.line, m.column]), [[2, 5]]);
    assert.deepEqual((await c.glob({ path: repo, pattern: "*.txt" })).paths, [join(repo, "a.txt")]);

    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const port = server.address().port;
    const ports = await c.listPorts();
    assert.ok(ports.some((p) => p.port === port), JSON.stringify(ports));
    const proxied = await fetch(c.portProxyUrl(port, "/x?y=1"), { headers: { Authorization: "Bearer tok" } });
    assert.equal(await proxied.text(), "app saw /x?y=1 auth=none");
    const preview = await c.createPreview(port, { ttl: "5m" });
    assert.ok(preview.url.startsWith(`${d.url}/preview/`), preview.url);
    const anon = await fetch(`${preview.url}page`);
    assert.equal(anon.status, 200);
    assert.equal(await anon.text(), "app saw /page auth=none");
  } finally {
    server.close();
    await d.stop();
  }
});
