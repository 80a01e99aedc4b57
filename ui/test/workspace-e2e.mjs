// The Changes and Ports tabs in a real browser (Debian's Chromium via playwright-core) against a
// real daemon: a repository built by the calling test, with a session whose `gitBase` the daemon
// recorded, and a real `python3 -m http.server` listening on a port. Run by
// `inspector_workspace::inspector_changes_and_ports_tabs_in_chromium`.
// Usage: node test/workspace-e2e.mjs <baseUrl> <token> <repo> <base> <appPort> <screenshotDir>
// Steps: "changes" (the repo's status and its diff against HEAD: a modified file with its +/-
// lines, an untracked one as added), "session" (the session picked from the list: path and
// base filled, the diff against the session's base includes the change committed since),
// "ports" (the app's row with its command), "preview" (the Preview link opens the app without
// any token, in a fresh browser context). Exits 0 and prints a JSON summary when every step
// passed; otherwise prints what failed and exits 1.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [baseUrl, token, repo, base, appPort, shots] = process.argv.slice(2);
if (!baseUrl || !token || !repo || !base || !appPort || !shots) {
  console.error("usage: node test/workspace-e2e.mjs <baseUrl> <token> <repo> <base> <appPort> <screenshotDir>");
  process.exit(64);
}
mkdirSync(shots, { recursive: true });
const WAIT = 15_000;
const watchdog = setTimeout(() => {
  console.error("workspace-e2e: gave up after 120 s");
  process.exit(1);
}, 120_000);
watchdog.unref();

function assert(ok, what) {
  if (!ok) throw new Error(`failed: ${what}`);
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
  const context = await browser.newContext({ viewport: { width: 1366, height: 800 } });
  const page = await context.newPage();
  page.on("pageerror", (e) => errors.push(String(e)));
  const byTestId = (id) => page.locator(`[data-testid="${id}"]`);

  await page.goto(`${baseUrl}/ui/`);
  await byTestId("token-input").fill(token);
  await byTestId("token-input").press("Enter");
  await page.locator('[data-testid="agent-select"] option[value="mock"]').waitFor({ state: "attached", timeout: WAIT });

  // Changes of a path against HEAD.
  await page.locator("#tab-changes").click();
  await byTestId("changes-path").fill(repo);
  await byTestId("changes-base").fill("");
  await byTestId("changes-show").click();
  const file = (path) => page.locator(`[data-testid="changes-file"][data-path="${path}"]`);
  await file("a.txt").waitFor({ timeout: WAIT });
  assert((await file("a.txt").getAttribute("data-status")) === "modified", "a.txt is modified");
  assert((await file("new.txt").getAttribute("data-status")) === "untracked", "new.txt is untracked");
  const patch = (path) => page.locator(`[data-testid="changes-diff-file"][data-path="${path}"] pre`);
  const adds = await patch("a.txt").locator(".d-add").allTextContents();
  const dels = await patch("a.txt").locator(".d-del").allTextContents();
  assert(adds.some((l) => l.trim() === "+TWO"), `the added line (${adds})`);
  assert(dels.some((l) => l.trim() === "-two"), `the removed line (${dels})`);
  assert((await patch("new.txt").locator(".d-add").allTextContents()).some((l) => l.trim() === "+fresh"), "new.txt's line");
  assert(!(await page.locator('[data-testid="changes-diff-file"][data-path="committed.txt"]').count()), "against HEAD: no committed.txt");
  assert((await byTestId("changes-summary").textContent()).includes("on main"), "the branch in the summary");
  await page.screenshot({ path: join(shots, "changes.png") });
  steps.push("changes");

  // The session's diff: picked from the list, against its gitBase.
  const option = page.locator('[data-testid="changes-session"] option[data-session-id]');
  await option.first().waitFor({ state: "attached", timeout: WAIT });
  await byTestId("changes-session").selectOption(await option.first().getAttribute("value"));
  await page.locator('[data-testid="changes-diff-file"][data-path="committed.txt"]').waitFor({ timeout: WAIT });
  assert((await byTestId("changes-base").inputValue()) === base, "the session's base filled in");
  assert((await byTestId("changes-path").inputValue()) === repo, "the session's cwd filled in");
  assert((await byTestId("changes-summary").textContent()).includes(`since ${base.slice(0, 12)}`), "the summary names the base");
  steps.push("session");

  // Ports: the app's row, then its preview link.
  await page.locator("#tab-ports").click();
  const row = page.locator(`[data-testid="port-row"][data-port="${appPort}"]`);
  await row.waitFor({ timeout: WAIT });
  const command = await row.locator('[data-testid="port-command"]').textContent();
  assert(command.includes("http.server"), `the app's command (${command})`);
  await page.screenshot({ path: join(shots, "ports.png") });
  steps.push("ports");

  await row.locator('[data-testid="port-preview-button"]').click();
  const link = page.locator(`[data-testid="port-row"][data-port="${appPort}"] [data-testid="port-preview-link"]`);
  await link.waitFor({ timeout: WAIT });
  const href = await link.getAttribute("href");
  assert(href.startsWith(`${baseUrl}/preview/`), `a preview link (${href})`);
  // The link survives the 2 s refresh of the table.
  await page.waitForTimeout(2500);
  assert((await link.getAttribute("href")) === href, "the link is kept across refreshes");
  const anon = await browser.newContext();
  const app = await anon.newPage();
  const res = await app.goto(`${href}hello.txt`);
  assert(res.status() === 200, `the app through the link answered ${res.status()}`);
  assert((await app.textContent("body")).includes("hello from the app"), "the app's page");
  await anon.close();
  steps.push("preview");
  assert(!errors.length, `no page errors (${errors})`);
} catch (e) {
  failed = e;
}
await browser.close();
if (failed) {
  console.error(String(failed?.stack ?? failed));
  console.log(JSON.stringify({ steps, errors }));
  process.exit(1);
}
console.log(JSON.stringify({ steps, errors }));
