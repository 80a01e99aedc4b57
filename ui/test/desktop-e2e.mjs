// The Desktop tab in a real browser (Debian's Chromium via playwright-core) against a real daemon
// on a real Xvfb: Start from the tab, an xterm launched through the API, frames drawn on the live
// view, a click on the xterm in the live view and keys typed on it reaching the xterm (whose shell
// writes the line to a file, read back here), a screenshot and a recording downloaded from the
// tab's buttons, and Stop. Run by `inspector_desktop::inspector_desktop_tab_drives_a_real_desktop_in_chromium`.
// Usage: node test/desktop-e2e.mjs <baseUrl> <token> <displayNum> <outFile> <screenshotDir>
// Exits 0 and prints a JSON summary when every step passed; otherwise prints what failed, exits 1.
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [baseUrl, token, display, outFile, shots] = process.argv.slice(2);
if (!baseUrl || !token || !display || !outFile || !shots) {
  console.error("usage: node test/desktop-e2e.mjs <baseUrl> <token> <displayNum> <outFile> <screenshotDir>");
  process.exit(64);
}
mkdirSync(shots, { recursive: true });
const WAIT = 15_000;
const watchdog = setTimeout(() => {
  console.error("desktop-e2e: gave up after 120 s");
  process.exit(1);
}, 120_000);
watchdog.unref();

function assert(ok, what) {
  if (!ok) throw new Error(`failed: ${what}`);
}

async function apiCall(method, path, body) {
  const res = await fetch(`${baseUrl}${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function until(check, what, timeoutMs = WAIT) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
});
const steps = [];
const errors = [];
let failed = null;
try {
  const context = await browser.newContext({ viewport: { width: 1366, height: 800 }, acceptDownloads: true });
  const page = await context.newPage();
  page.on("pageerror", (e) => errors.push(String(e)));
  const byTestId = (id) => page.locator(`[data-testid="${id}"]`);

  await page.goto(`${baseUrl}/ui/`);
  await byTestId("token-input").fill(token);
  await byTestId("token-input").press("Enter");
  await page.locator('[data-testid="agent-select"] option[value="mock"]').waitFor({ state: "attached", timeout: WAIT });
  await page.locator("#tab-desktop").click();
  await byTestId("desktop-state").filter({ hasText: /inactive|install_required/ }).waitFor({ timeout: WAIT });
  steps.push("tab");

  await byTestId("desktop-display").fill(display);
  await byTestId("desktop-start").click();
  await byTestId("desktop-state").filter({ hasText: `active (:${display})` }).waitFor({ timeout: WAIT });
  const canvas = byTestId("desktop-view");
  await until(async () => (await canvas.getAttribute("data-ready")) === "true", "the live view's ready");
  const size = await canvas.evaluate((c) => [c.width, c.height]);
  const res = (await apiCall("GET", "/v1/desktop/status")).resolution;
  assert(size[0] === res.width && size[1] === res.height, `canvas is the screen size (${size})`);
  steps.push("start");

  // An xterm filling the left half; its shell writes the line it reads to outFile.
  const launched = await apiCall("POST", "/v1/desktop/launch", {
    app: "xterm",
    args: ["-geometry", "40x12+0+0", "-e", "sh", "-c", `read line; printf %s "$line" > ${outFile}`],
    wait: true,
  });
  assert(launched.windowId, "the xterm has a window");
  const win = (await apiCall("GET", "/v1/desktop/windows")).windows.find((w) => w.id === launched.windowId);
  assert(win, "the xterm is listed");
  const before = Number(await canvas.getAttribute("data-frames"));
  await until(async () => Number(await canvas.getAttribute("data-frames")) > before + 1, "frames drawn after the launch");
  await page.screenshot({ path: join(shots, "desktop-live-view.png") });
  steps.push("frames");

  // Click in the middle of the xterm's window, on the canvas (scaled by CSS), then type.
  // The canvas is scaled down by CSS: one CSS pixel is 1/sx screen pixels, the precision a click has.
  const [cw, ch] = await canvas.evaluate((c) => [c.clientWidth, c.clientHeight]);
  const sx = cw / size[0];
  const sy = ch / size[1];
  const cx = win.x + win.width / 2;
  const cy = win.y + win.height / 2;
  await canvas.click({ position: { x: cx * sx, y: cy * sy } });
  const pos = await until(async () => {
    const p = await apiCall("GET", "/v1/desktop/mouse/position");
    return Math.abs(p.x - cx) <= 1 / sx + 1 && Math.abs(p.y - cy) <= 1 / sy + 1 ? p : null;
  }, "the pointer at the clicked point");
  assert(pos.window, "the click landed on a window");
  await until(async () => (await apiCall("GET", "/v1/desktop/windows/focused")).id === launched.windowId, "the xterm focused");
  await page.keyboard.type("typed in chromium");
  await page.keyboard.press("Enter");
  const typed = await until(() => (existsSync(outFile) ? readFileSync(outFile, "utf8") : null), "the typed line in the file");
  assert(typed === "typed in chromium", `the xterm got the keys (${JSON.stringify(typed)})`);
  steps.push("click-and-type");

  const [shot] = await Promise.all([page.waitForEvent("download", { timeout: WAIT }), byTestId("desktop-screenshot").click()]);
  const png = readFileSync(await shot.path());
  assert(png.subarray(1, 4).toString() === "PNG", "the screenshot is a PNG");
  assert(png.readUInt32BE(16) === res.width && png.readUInt32BE(20) === res.height, "the screenshot is the screen's size");
  steps.push("screenshot");

  await byTestId("desktop-record").click();
  await byTestId("desktop-record").filter({ hasText: "Stop recording" }).waitFor({ timeout: WAIT });
  await new Promise((r) => setTimeout(r, 1200));
  await byTestId("desktop-record").click();
  await page.locator('[data-testid="desktop-recordings"] li[data-status="completed"]').first().waitFor({ timeout: WAIT });
  const [video] = await Promise.all([
    page.waitForEvent("download", { timeout: WAIT }),
    page.locator('[data-testid="desktop-recordings"] li[data-status="completed"] [data-testid="desktop-download"]').first().click(),
  ]);
  const mp4 = readFileSync(await video.path());
  assert(mp4.subarray(4, 8).toString() === "ftyp", "the recording is an MP4");
  steps.push("recording");

  await byTestId("desktop-stop").click();
  await byTestId("desktop-state").filter({ hasText: "inactive" }).waitFor({ timeout: WAIT });
  assert((await apiCall("GET", "/v1/desktop/status")).state === "inactive", "the daemon's desktop stopped");
  steps.push("stop");
  assert(errors.length === 0, `no page errors (${errors.join("; ")})`);
} catch (e) {
  failed = e;
  try {
    const notice = await browser.contexts()[0]?.pages()[0]?.locator('[data-testid="error"]').textContent();
    console.error(`page notice: ${notice}; pointer: ${JSON.stringify(await apiCall("GET", "/v1/desktop/mouse/position"))}; windows: ${JSON.stringify(await apiCall("GET", "/v1/desktop/windows"))}`);
  } catch (e2) {
    console.error(`(no details: ${e2})`);
  }
} finally {
  await browser.close();
}
if (failed) {
  console.error(`desktop-e2e failed after ${JSON.stringify(steps)}: ${failed.stack ?? failed}`);
  process.exit(1);
}
console.log(JSON.stringify({ steps }));
