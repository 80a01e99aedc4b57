// The transport in a real browser: headless Chromium (Debian's, driven by playwright-core, never a
// downloaded browser) loads a page that runs acp-http-client and sandbox-agent against the daemon
// and completes initialize -> session -> prompt with updates over SSE.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { createServer, request as httpRequest } from "node:http";
import { readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { join, dirname, normalize, extname } from "node:path";
import { fileURLToPath } from "node:url";
import { startDaemon, binaryExists, BIN, skipOrFail } from "./support.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".map": "application/json" };

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

/**
 * Serves the page and the packages' files from the workspace. When the daemon has no
 * `--allowed-origins` (older builds), it also forwards `/v1/*` to the daemon so the page stays
 * same-origin; otherwise the page talks to the daemon cross-origin, through its CORS answers.
 */
async function startPageServer(daemonUrl) {
  const server = createServer(async (req, res) => {
    const url = new URL(req.url, "http://x");
    if (daemonUrl && url.pathname.startsWith("/v1/")) {
      const target = new URL(req.url, daemonUrl);
      const headers = { ...req.headers, host: target.host };
      delete headers.origin;
      const up = httpRequest(target, { method: req.method, headers }, (r) => {
        res.writeHead(r.statusCode, r.headers);
        r.pipe(res);
      });
      up.on("error", () => res.destroy());
      req.pipe(up);
      res.on("close", () => up.destroy());
      return;
    }
    const path = url.pathname === "/" ? "/test/fixtures/browser.html" : url.pathname;
    const file = normalize(join(root, path));
    if (!file.startsWith(root)) return void res.writeHead(403).end();
    try {
      const body = await readFile(file);
      res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" }).end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { server, url: `http://127.0.0.1:${server.address().port}` };
}

function daemonHasAllowedOrigins() {
  return execFileSync(BIN, ["server", "--help"]).toString().includes("--allowed-origins");
}

/**
 * Opens `pageUrl` in a fresh headless Chromium and waits (30 s at most) for the page's
 * `window.__result`; returns it with the page's console output and errors.
 */
async function pageResult(chromium, pageUrl) {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  try {
    const tab = await browser.newPage();
    const logs = [];
    tab.on("console", (m) => logs.push(m.text()));
    tab.on("pageerror", (e) => logs.push(String(e)));
    await tab.goto(pageUrl);
    await tab.waitForFunction(() => window.__result !== undefined, null, { timeout: 30_000 });
    return { result: await tab.evaluate(() => window.__result), logs };
  } finally {
    await browser.close();
  }
}

test("in headless Chromium: initialize -> session -> prompt with updates over SSE", async (t) => {
  if (!existsSync(CHROMIUM)) return skipOrFail(t, `no Chromium at ${CHROMIUM} (apt-get install chromium)`);
  let chromium;
  try {
    ({ chromium } = await import("playwright-core"));
  } catch {
    return skipOrFail(t, "playwright-core is not installed (npm ci in sdks/typescript)");
  }
  const cors = daemonHasAllowedOrigins();
  // The page server must exist first when the daemon needs its origin.
  const page = await startPageServer(null);
  let d;
  let proxy;
  try {
    d = await startDaemon({ args: cors ? ["--allowed-origins", page.url] : [] });
    let daemonForPage = d.url;
    if (!cors) {
      await new Promise((r) => page.server.close(r));
      proxy = await startPageServer(d.url);
      daemonForPage = proxy.url;
    }
    const pageUrl = `${(proxy ?? page).url}/?daemon=${encodeURIComponent(daemonForPage)}`;
    const { result, logs } = await pageResult(chromium, pageUrl);
    assert.equal(result.ok, true, `${result.error}\n${logs.join("\n")}`);
    assert.match(result.userAgent, /Chrome/);
    assert.equal(result.agent, "mock");
    assert.equal(result.stopReason, "end_turn");
    assert.deepEqual(result.updates, [1, 2, 3, 4, 5].map((i) => `chunk ${i} of 5`));
    assert.equal(result.sdkStopReason, "end_turn");
    assert.deepEqual(result.sdkUpdates, [1, 2, 3].map((i) => `chunk ${i} of 3`));
    t.diagnostic(cors ? "cross-origin, through the daemon's CORS" : "same-origin, through the page server");
  } finally {
    if (page.server.listening) await new Promise((r) => page.server.close(r));
    if (proxy) {
      proxy.server.closeAllConnections();
      await new Promise((r) => proxy.server.close(r));
    }
    await d?.stop();
  }
});

test("in headless Chromium with a token: the ACP WebSocket transport and a process terminal carry it in the URL", async (t) => {
  if (!existsSync(CHROMIUM)) return skipOrFail(t, `no Chromium at ${CHROMIUM} (apt-get install chromium)`);
  let chromium;
  try {
    ({ chromium } = await import("playwright-core"));
  } catch {
    return skipOrFail(t, "playwright-core is not installed (npm ci in sdks/typescript)");
  }
  const page = await startPageServer(null);
  const token = "browser-ws-token";
  let d;
  try {
    d = await startDaemon({ token, args: ["--allowed-origins", page.url] });
    const pageUrl = `${page.url}/test/fixtures/browser-ws.html?daemon=${encodeURIComponent(d.url)}&token=${token}`;
    const { result, logs } = await pageResult(chromium, pageUrl);
    assert.equal(result.ok, true, `${result.error}\n${logs.join("\n")}\ndaemon:\n${d.stderr()}`);
    assert.equal(result.stopReason, "end_turn");
    assert.deepEqual(result.updates, [1, 2, 3, 4].map((i) => `chunk ${i} of 4`));
    assert.equal(result.terminalSawAnswer, true);
    assert.deepEqual(result.exits, [4]);
    assert.equal(result.followed, "a\nb\n");
    // The sockets were upgrades with the token in the URL; the daemon logged neither.
    assert.ok(!d.stderr().includes(token), "the token reached the daemon's log");
  } finally {
    if (page.server.listening) await new Promise((r) => page.server.close(r));
    await d?.stop();
  }
});
