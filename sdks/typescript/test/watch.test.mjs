// HostApi.watch() against the real daemon: changes as an async iterator, refusals thrown, a cut
// connection made again with a `rescan` item at the point the feed is live again, an overflow
// turned into a `rescan` item with the feed going on, and the abort signal ending the iteration.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";
import { SandboxAgentClient, HttpError } from "sandbox-agent";
import { startDaemon, startProxy, binaryExists, BIN } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

const TOKEN = "watch-token";

/** Pulls items from the iterator until `done(items)` is true (or fails after `ms`). */
async function until(it, done, ms = 20_000) {
  const items = [];
  const deadline = Date.now() + ms;
  while (!done(items)) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`timed out; got ${JSON.stringify(items, null, 1)}`);
    let timer;
    const r = await Promise.race([
      it.next(),
      new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out; got ${JSON.stringify(items)}`)), left))),
    ]);
    clearTimeout(timer);
    if (r.done) throw new Error(`iteration ended; got ${JSON.stringify(items)}`);
    items.push(r.value);
  }
  return items;
}

const has = (items, kind, path) => items.some((i) => i.kind === kind && i.path === path);

test("watch yields creates, renames, removes with absolute paths; refusals are thrown; the signal ends it", async () => {
  const d = await startDaemon({ token: TOKEN });
  const c = new SandboxAgentClient({ baseUrl: d.url, token: TOKEN, agent: "mock", autoConnect: false });
  try {
    await assert.rejects(
      async () => {
        for await (const _ of c.watch("missing")) break;
      },
      (e) => e instanceof HttpError && e.status === 404,
    );
    const ac = new AbortController();
    const it = c.watch(".", { recursive: true, ignore: ["node_modules"], signal: ac.signal });
    // The first item says the feed is live.
    assert.deepEqual((await it.next()).value, { kind: "rescan", reason: "start" });
    mkdirSync(join(d.workDir, "src"));
    writeFileSync(join(d.workDir, "src/a.ts"), "x");
    mkdirSync(join(d.workDir, "node_modules"));
    writeFileSync(join(d.workDir, "node_modules/x"), "x");
    // A new directory is watched, then listed: a rename inside it is seen as one only once the
    // feed has reached it (before that, the listing reports the file under its latest name).
    const seen = await until(it, (xs) => has(xs, "create", join(d.workDir, "src/a.ts")));
    renameSync(join(d.workDir, "src/a.ts"), join(d.workDir, "src/b.ts"));
    rmSync(join(d.workDir, "src/b.ts"));
    const items = [...seen, ...(await until(it, (xs) => has(xs, "remove", join(d.workDir, "src/b.ts"))))];
    assert.ok(has(items, "create", join(d.workDir, "src")), JSON.stringify(items));
    const rename = items.find((i) => i.kind === "rename");
    assert.equal(rename?.oldPath, join(d.workDir, "src/a.ts"));
    assert.equal(rename?.path, join(d.workDir, "src/b.ts"));
    assert.equal(rename?.entryType, "file");
    assert.ok(!items.some((i) => i.path?.includes("node_modules")), JSON.stringify(items));
    ac.abort();
    const end = await it.next();
    assert.equal(end.done, true);
  } finally {
    await d.stop();
  }
});

test("a cut connection is made again: a rescan item, then the changes go on", async () => {
  const d = await startDaemon({ token: TOKEN });
  const proxy = await startProxy(d.url);
  const c = new SandboxAgentClient({ baseUrl: proxy.url, token: TOKEN, agent: "mock", autoConnect: false });
  try {
    const it = c.watch(".", { recursive: true, maxReconnectDelayMs: 200 });
    assert.equal((await it.next()).value.reason, "start");
    writeFileSync(join(d.workDir, "before"), "x");
    await until(it, (xs) => has(xs, "create", join(d.workDir, "before")));
    proxy.cutSse();
    // Made while the connection is down: found by the caller's rescan, not by the feed.
    writeFileSync(join(d.workDir, "during"), "x");
    const next = await until(it, (xs) => xs.some((i) => i.kind === "rescan"));
    assert.deepEqual(next.at(-1), { kind: "rescan", reason: "reconnect" });
    // Live again: what happens now is reported.
    writeFileSync(join(d.workDir, "after"), "x");
    await until(it, (xs) => has(xs, "create", join(d.workDir, "after")));
    await it.return();
  } finally {
    await proxy.close();
    await d.stop();
  }
});

test("an overflow becomes a rescan item and the feed goes on", async () => {
  // A queue of 1 KiB (a few changes) overflows under a burst of creations.
  const d = await startDaemon({ token: TOKEN, args: ["--watch-queue", "1K"] });
  const c = new SandboxAgentClient({ baseUrl: d.url, token: TOKEN, agent: "mock", autoConnect: false });
  try {
    mkdirSync(join(d.workDir, "burst"));
    const it = c.watch("burst");
    assert.equal((await it.next()).value.reason, "start");
    // Nothing is read while the loop runs (it is synchronous): 20,000 changes are megabytes of
    // events, more than the socket buffers between the daemon and this reader can absorb, so the
    // daemon's own 1 KiB queue must overflow (1,000 could fit in the buffers and arrive whole).
    for (let i = 0; i < 20000; i++) writeFileSync(join(d.workDir, `burst/f${i}`), "");
    const items = await until(it, (xs) => xs.some((i) => i.kind === "rescan"));
    const rescan = items.find((i) => i.kind === "rescan");
    assert.equal(rescan.reason, "overflow");
    assert.ok(["reader", "kernel"].includes(rescan.cause), JSON.stringify(rescan));
    // The feed goes on: a marker made once the backlog has drained is reported (one made while
    // the queue is still full may itself be dropped, with another overflow saying so).
    let n = 0;
    const marker = setInterval(() => writeFileSync(join(d.workDir, `burst/last${n++}`), "x"), 300);
    try {
      await until(it, (xs) => xs.some((i) => i.kind === "create" && i.path.includes("/burst/last")), 60_000);
    } finally {
      clearInterval(marker);
    }
    await it.return();
  } finally {
    await d.stop();
  }
});
