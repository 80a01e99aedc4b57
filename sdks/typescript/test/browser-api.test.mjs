// The SDK's browser client (`host.browser`) against the real daemon and a real Chromium: status
// before start, problems as HttpError (409 before start, 400 naming the field), start, navigate to
// a page served on loopback, a viewport and a full-page screenshot (PNG sizes read back), text and
// markdown, the accessibility snapshot, tabs opened/activated/closed, Playwright connecting
// through the URL `cdpUrl` gives, and stop.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { existsSync } from "node:fs";
import { chromium } from "playwright-core";
import { HostApi, HttpError } from "sandbox-agent";
import { startDaemon, eventually, binaryExists, BIN, skipOrFail } from "./support.mjs";

const TOKEN = "browser-api-tok";
const CHROMIUM = "/usr/bin/chromium";
const PAGE = `<!doctype html><html><head><title>SDK page</title></head><body style="margin:0">
<h1>SDK heading</h1><p>Some <b>bold</b> words.</p><button>Click me</button>
<div style="height:2500px">tall</div></body></html>`;

let d;
let host;
let server;
let base;
before(async () => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
  server = createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/html" });
    res.end(PAGE);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}`;
  d = await startDaemon({ token: TOKEN });
  host = new HostApi({ baseUrl: d.url, token: TOKEN });
});
after(async () => {
  await d?.stop();
  server?.close();
});

function pngSize(b) {
  assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], "not a PNG");
  const v = new DataView(b.buffer, b.byteOffset);
  return [v.getUint32(16), v.getUint32(20)];
}

const status = (code) => (e) => e instanceof HttpError && e.status === code;

test("browser: problems before start, then a page driven through every route, CDP, stop", async (t) => {
  const br = host.browser;
  assert.equal((await br.status()).state, "inactive");
  await assert.rejects(br.listTabs(), status(409));
  await assert.rejects(br.screenshot(), status(409));
  await assert.rejects(
    br.navigate({ url: "file:///etc/passwd" }),
    (e) => e instanceof HttpError && e.status === 400 && e.problem?.field === "url",
  );
  await assert.rejects(br.start({ width: 5 }), status(400));
  if (!existsSync(CHROMIUM)) return skipOrFail(t, `${CHROMIUM} is missing; run .ci/install-inspector.sh`);

  const s = await br.start({ width: 800, height: 600 });
  assert.equal(s.state, "active");
  assert.equal(s.headless, true);
  assert.ok(s.pid > 0);
  assert.equal(s.restarts, 0);
  const tab = await br.navigate({ url: `${base}/page`, waitUntil: "load" });
  assert.equal(tab.title, "SDK page");

  const [vw, vh] = pngSize(await br.screenshot());
  assert.ok(vh <= 600 && vw <= 800, `${vw}x${vh}`);
  const [, fh] = pngSize(await br.screenshot({ fullPage: true }));
  assert.ok(fh > 2500 && fh > vh, `full page ${fh} tall`);
  const jpeg = await br.screenshot({ format: "jpeg", quality: 40 });
  assert.deepEqual([...jpeg.subarray(0, 2)], [0xff, 0xd8]);
  await assert.rejects(br.screenshot({ format: "gif" }), status(400));

  const text = await br.content();
  assert.equal(text.format, "text");
  assert.match(text.content, /SDK heading/);
  const md = await br.content({ format: "markdown" });
  assert.match(md.content, /# SDK heading/);
  assert.match(md.content, /\*\*bold\*\*/);
  const ax = await br.accessibility();
  assert.ok(ax.nodes.some((n) => n.role === "heading" && n.name === "SDK heading"), JSON.stringify(ax.nodes));
  assert.ok(ax.nodes.some((n) => n.role === "button" && n.name === "Click me"));
  const small = await br.accessibility({ maxNodes: 2 });
  assert.equal(small.nodes.length, 2);
  assert.equal(small.truncated, true);

  const second = await br.openTab({ url: "about:blank" });
  assert.equal((await br.listTabs()).length, 2);
  await br.activateTab(tab.id);
  await br.closeTab(second.id);
  await eventually(async () => ((await br.listTabs()).length === 1 ? true : null), { what: "the tab closes" });
  await assert.rejects(br.closeTab("ABCDEF0123"), status(404));
  await assert.rejects(br.content({ tabId: "bad/id" }), status(400));

  const version = await br.cdpVersion();
  assert.ok(version.webSocketDebuggerUrl.endsWith("/v1/browser/cdp"), version.webSocketDebuggerUrl);
  assert.equal(br.cdpEndpoint(), `${d.url}/v1/browser/cdp`);
  assert.match(br.cdpUrl("t"), /^ws:\/\/.*\/v1\/browser\/cdp\?access_token=t$/);
  // Playwright over the proxy, once by the WebSocket URL with the token, once by the HTTP endpoint.
  for (const connect of [
    () => chromium.connectOverCDP(br.cdpUrl(TOKEN)),
    () => chromium.connectOverCDP(br.cdpEndpoint(), { headers: { Authorization: `Bearer ${TOKEN}` } }),
  ]) {
    const browser = await connect();
    const page = browser.contexts()[0].pages().find((p) => p.url().startsWith(base));
    assert.ok(page, "the daemon's tab is one of Playwright's pages");
    assert.equal(await page.locator("h1").innerText(), "SDK heading");
    await browser.close();
  }

  const stopped = await br.stop();
  assert.equal(stopped.state, "inactive");
  await assert.rejects(br.accessibility(), status(409));
});
