// The inspector's link between OpenCode sessions and their ACP instances, in Debian's Chromium
// (playwright-core): the Instances tab names the OpenCode session (title and id) of the instance
// behind it, and no other instance; the Sessions tab lists the OpenCode sessions with their ACP
// instance and ACP session, and the instance's button leads to its row in the Instances tab.
// Run by tests/it/inspector_opencode.rs, which starts the daemon and makes the session.
// Usage: node test/opencode-link.mjs <baseUrl> <token> <openCodeSessionId> <title> <plainServerId> <screenshotDir>
// Prints a JSON summary and exits 0 when everything held; otherwise prints what failed, exits 1.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [baseUrl, token, sessionId, title, plain, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node test/opencode-link.mjs <baseUrl> <token> <sessionId> <title> <plainServerId> <screenshotDir>");
  process.exit(64);
}
mkdirSync(shots, { recursive: true });
const WAIT = 15_000;
const watchdog = setTimeout(() => {
  console.error("opencode-link: gave up after 90 s");
  process.exit(1);
}, 90_000);
watchdog.unref();

const problems = [];
const serverId = `opencode-${sessionId}`;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
});
let failed = null;
const checked = [];
try {
  const page = await (await browser.newContext({ viewport: { width: 1366, height: 800 } })).newPage();
  page.on("console", (m) => m.type() === "error" && problems.push(`console: ${m.text()}`));
  page.on("pageerror", (e) => problems.push(`page error: ${e}`));
  page.on("response", (r) => r.status() >= 400 && problems.push(`${r.status()} ${r.request().method()} ${r.url()}`));
  const byTestId = (id) => page.locator(`[data-testid="${id}"]`);

  await page.goto(`${baseUrl}/ui/`);
  // The page asks for a token first (a 401 it provokes on purpose, not a problem).
  await byTestId("token-input").waitFor({ timeout: WAIT });
  await byTestId("token-input").fill(token);
  await byTestId("token-input").press("Enter");
  await page.locator('[data-testid="agent-select"] option[value="mock"]').waitFor({ state: "attached", timeout: WAIT });
  problems.length = 0;

  // From the instance's side.
  await page.locator("#tab-instances").click();
  const instances = byTestId("instances-table");
  const link = instances.locator(`tr[data-server-id="${serverId}"] [data-field="opencode-session"]`);
  await link.locator('[data-field="opencode-title"]', { hasText: title }).waitFor({ timeout: WAIT });
  const shownId = await link.locator('[data-field="opencode-session-id"]').textContent();
  if (shownId !== sessionId) throw new Error(`the instance names session ${shownId}, not ${sessionId}`);
  await instances.locator(`tr[data-server-id="${plain}"]`).waitFor({ timeout: WAIT });
  if ((await instances.locator(`tr[data-server-id="${plain}"] [data-field="opencode-session"]`).count()) !== 0) {
    throw new Error(`the plain instance ${plain} claims an OpenCode session`);
  }
  await page.screenshot({ path: join(shots, "opencode-instance.png") });
  checked.push("instance-names-its-opencode-session");

  // From the OpenCode session's side.
  await page.locator("#tab-sessions").click();
  const row = byTestId("opencode-sessions-table").locator(`tr[data-opencode-session="${sessionId}"]`);
  await row.locator('[data-field="opencode-title"]', { hasText: title }).waitFor({ timeout: WAIT });
  const acp = await row.locator('[data-field="acp-server-id"]').textContent();
  if (acp !== serverId) throw new Error(`the OpenCode session names instance ${acp}, not ${serverId}`);
  const acpSession = (await row.locator('[data-field="acp-session-id"]').textContent()) ?? "";
  if (!acpSession.startsWith("mock-")) throw new Error(`no ACP session shown: ${acpSession}`);
  await page.screenshot({ path: join(shots, "opencode-sessions.png") });
  checked.push("opencode-session-names-its-instance");

  // Its button leads to the instance.
  await row.locator('[data-field="acp-server-id"]').click();
  await page.locator(`#panel-instances:not([hidden]) tr.revealed[data-server-id="${serverId}"]`).waitFor({ timeout: WAIT });
  checked.push("button-reveals-the-instance");
  if (problems.length) throw new Error(`the page reported problems:\n${problems.join("\n")}`);
} catch (error) {
  failed = error;
} finally {
  await browser.close();
}
if (failed) {
  console.error(String(failed?.stack ?? failed));
  process.exit(1);
}
console.log(JSON.stringify({ checked }));
