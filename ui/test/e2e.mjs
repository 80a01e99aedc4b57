// The inspector's end-to-end proof in a real browser: Debian's Chromium (never a downloaded one),
// driven by playwright-core against a real daemon and its mock agent, through the seven steps of
// issue 13 plus the files panel, a scripted agent's richer updates, a lagging event stream and a
// gap (docs/inspector.md lists them). A screenshot of each step goes to the screenshot directory.
// Run by the Rust integration test `inspector::inspector_drives_the_mock_agent_in_chromium`,
// which starts the daemons and the scripted agent's agents file.
// Usage: node test/e2e.mjs <baseUrl> <token> <screenshotDir> [<gapBaseUrl>]
// <gapBaseUrl>, if given, is a second daemon (same token) keeping only 10 events per serverId,
// for the extra step that shows a `gap` in the log.
// Exits 0 when every step passed; otherwise prints what failed and exits 1.
import { mkdirSync } from "node:fs";
import { request as httpRequest, createServer } from "node:http";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [baseUrl, token, shots, gapBaseUrl] = process.argv.slice(2);
if (!baseUrl || !token || !shots) {
  console.error("usage: node test/e2e.mjs <baseUrl> <token> <screenshotDir>");
  process.exit(64);
}
mkdirSync(shots, { recursive: true });
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const WAIT = 15_000;

// The whole run is bounded: a hung browser must not hang CI.
const watchdog = setTimeout(() => {
  console.error("e2e: gave up after 180 s");
  process.exit(1);
}, 180_000);
watchdog.unref();

/** Everything the browser reported that may be an error; checked against `allowed` in step 7. */
const seen = { console: [], pageErrors: [], failedRequests: [], badResponses: [] };
/** HTTP errors a step provokes on purpose: [step, method, path regexp, status]. */
const allowed = [];
/** Requests a step makes the page abort on purpose (Disconnect closes the event stream). */
const allowedAborts = [];
let step = "setup";

function assert(ok, what) {
  if (!ok) throw new Error(`failed: ${what}`);
}

function watch(page) {
  page.on("console", (msg) => {
    if (msg.type() === "error" || msg.type() === "warning") {
      seen.console.push({ step, type: msg.type(), text: msg.text(), url: msg.location()?.url ?? "" });
    }
  });
  page.on("pageerror", (err) => seen.pageErrors.push({ step, text: String(err) }));
  page.on("requestfailed", (req) => {
    seen.failedRequests.push({ step, method: req.method(), url: req.url(), error: req.failure()?.errorText ?? "" });
  });
  page.on("response", (res) => {
    if (res.status() >= 400) seen.badResponses.push({ step, method: res.request().method(), url: res.url(), status: res.status() });
  });
}

const results = [];
async function run(name, fn) {
  step = name;
  const started = Date.now();
  await fn();
  results.push({ step: name, ms: Date.now() - started });
}

async function shot(page, name) {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: false });
}

const byTestId = (page, id) => page.locator(`[data-testid="${id}"]`);

async function sendPrompt(page, text) {
  await byTestId(page, "prompt-input").fill(text);
  await byTestId(page, "send-button").click();
}

async function turnEnds(page, n) {
  await page.locator('[data-testid="transcript"] [data-role="turn-end"]').nth(n - 1).waitFor({ timeout: WAIT });
}

/**
 * An HTTP proxy to `target` that delays every chunk of an event stream (`text/event-stream`
 * answers) by `lagMs`, in order; everything else passes at once. Host is passed through, so the
 * page's origin is the proxy's own.
 */
function lagProxy(target, lagMs) {
  const upstream = new URL(target);
  const server = createServer((req, res) => {
    const up = httpRequest(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers },
      (ures) => {
        res.writeHead(ures.statusCode, ures.headers);
        const sse = String(ures.headers["content-type"] ?? "").startsWith("text/event-stream");
        if (!sse) return void ures.pipe(res);
        ures.on("data", (chunk) => setTimeout(() => res.write(chunk), lagMs));
        ures.on("end", () => setTimeout(() => res.end(), lagMs));
      },
    );
    up.on("error", () => res.destroy());
    // The page went away (e.g. Disconnect aborts the stream): drop the upstream request too.
    res.on("close", () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
      }),
    ),
  );
}

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
  ],
});

let failed = null;
let serverId = "";
try {
  const context = await browser.newContext({ viewport: { width: 1366, height: 800 } });
  const page = await context.newPage();
  watch(page);

  await run("1-hello", async () => {
    await page.goto(`${baseUrl}/ui/`);
    // Without a token the daemon refuses the API: the page says so (this is the 401 it provokes).
    allowed.push(["1-hello", "GET", /\/v1\//, 401]);
    await byTestId(page, "error").filter({ hasText: "needs a bearer token" }).waitFor({ timeout: WAIT });
    // No token yet: it is required, not refused.
    await byTestId(page, "status").filter({ hasText: "token required" }).waitFor({ timeout: WAIT });
    await byTestId(page, "token-input").fill(`${token}-not-it`);
    await byTestId(page, "token-input").press("Enter");
    await byTestId(page, "status").filter({ hasText: "token refused" }).waitFor({ timeout: WAIT });
    await byTestId(page, "token-input").fill(token);
    await byTestId(page, "token-input").press("Enter");
    await page.locator('[data-testid="agent-select"] option[value="mock"]').waitFor({ state: "attached", timeout: WAIT });
    await byTestId(page, "error").waitFor({ state: "hidden", timeout: WAIT });
    // The right token loaded the agents: the status no longer speaks of the token.
    await byTestId(page, "status").filter({ hasText: "not connected" }).waitFor({ timeout: WAIT });
    // The built-in mock has nothing to install: no Install/Reinstall button.
    await byTestId(page, "agents-table").locator('tr[data-agent="mock"] [data-field="builtin"]').waitFor({ timeout: WAIT });
    if ((await byTestId(page, "install-mock").count()) !== 0) throw new Error("the built-in mock offers an install");
    await byTestId(page, "agent-select").selectOption("mock");
    serverId = await byTestId(page, "server-id-input").inputValue();
    await byTestId(page, "connect-button").click();
    await byTestId(page, "status").filter({ hasText: "connected to mock" }).waitFor({ timeout: WAIT });
    await byTestId(page, "session-new-button").click();
    await byTestId(page, "session-id").filter({ hasText: "mock-" }).waitFor({ timeout: WAIT });
    await sendPrompt(page, "hello");
    await page.locator('[data-testid="transcript"] [data-role="agent"]', { hasText: "hello" }).waitFor({ timeout: WAIT });
    await turnEnds(page, 1);
    const log = byTestId(page, "raw-log");
    await log.locator('li[data-direction="out"][data-method="session/prompt"]').first().waitFor({ timeout: WAIT });
    await log.locator('li[data-direction="in"][data-method="session/update"]').first().waitFor({ timeout: WAIT });
    await log.locator('li[data-direction="in"][data-method="session/prompt"][data-rpc="response"]').first().waitFor({ timeout: WAIT });
    // The update came over SSE: it carries its event id.
    const sseId = await log.locator('li[data-direction="in"][data-method="session/update"]').first().getAttribute("data-sse-id");
    if (!/^\d+$/.test(sseId ?? "")) throw new Error(`the session/update row has no SSE id: ${sseId}`);
    await shot(page, "1-hello");
  });

  await run("2-stream", async () => {
    await sendPrompt(page, "/stream 100");
    await turnEnds(page, 2);
    const message = page.locator('[data-testid="transcript"] [data-role="agent"]').last();
    const chunks = await message.locator(".chunk").allTextContents();
    const expected = Array.from({ length: 100 }, (_, i) => `chunk ${i + 1} of 100`);
    if (JSON.stringify(chunks) !== JSON.stringify(expected)) {
      throw new Error(`expected 100 chunks in order, got ${chunks.length}: ${JSON.stringify(chunks.slice(0, 5))}…`);
    }
    // The log reads its own copy of the stream: wait for it rather than assume it is as far.
    await page.waitForFunction(
      () => document.querySelectorAll('[data-testid="raw-log"] li[data-direction="in"][data-method="session/update"]').length >= 101,
      null,
      { timeout: WAIT },
    );
    await shot(page, "2-stream");
  });

  await run("3-permission", async () => {
    await sendPrompt(page, "/permission");
    const dialog = byTestId(page, "permission-dialog");
    await dialog.waitFor({ state: "visible", timeout: WAIT });
    const options = await dialog.locator("button[data-option-id]").evaluateAll((bs) => bs.map((b) => b.dataset.kind));
    if (JSON.stringify(options) !== JSON.stringify(["allow_once", "allow_always", "reject_once"])) {
      throw new Error(`unexpected permission options ${JSON.stringify(options)}`);
    }
    await shot(page, "3-permission-dialog");
    const allowOnce = dialog.locator('button[data-kind="allow_once"]');
    const optionId = await allowOnce.getAttribute("data-option-id");
    // Keyboard: the first option has the focus; Enter chooses it.
    await page.keyboard.press("Enter");
    await dialog.waitFor({ state: "hidden", timeout: WAIT });
    await page.locator('[data-testid="transcript"] [data-role="agent"]', { hasText: `permission: ${optionId}` }).waitFor({ timeout: WAIT });
    await turnEnds(page, 3);
    await byTestId(page, "raw-log")
      .locator('li[data-direction="out"][data-method="session/request_permission"][data-rpc="response"]')
      .waitFor({ timeout: WAIT });
    await shot(page, "3-permission");
  });

  await run("4-cancel", async () => {
    await sendPrompt(page, "/hang");
    const cancel = byTestId(page, "cancel-button");
    await page.waitForFunction(() => !document.querySelector('[data-testid="cancel-button"]').disabled, null, { timeout: WAIT });
    await cancel.click();
    await page.locator('[data-testid="transcript"] [data-role="turn-end"][data-stop-reason="cancelled"]').waitFor({ timeout: WAIT });
    await byTestId(page, "raw-log").locator('li[data-direction="out"][data-method="session/cancel"]').waitFor({ timeout: WAIT });
    await shot(page, "4-cancel");
    // Without the mouse: Escape in the prompt field cancels the running turn too.
    await byTestId(page, "prompt-input").fill("/hang");
    await byTestId(page, "prompt-input").press("Enter");
    await page.waitForFunction(() => !document.querySelector('[data-testid="cancel-button"]').disabled, null, { timeout: WAIT });
    await byTestId(page, "prompt-input").press("Escape");
    await page.locator('[data-testid="transcript"] [data-role="turn-end"][data-stop-reason="cancelled"]').nth(1).waitFor({ timeout: WAIT });
  });

  await run("instance-figures", async () => {
    // The instances tab draws memory and CPU sparklines from its 2 s refreshes.
    await page.locator("#tab-instances").click();
    await page.waitForFunction(
      (id) => {
        const row = document.querySelector(`[data-testid="instances-table"] tr[data-server-id="${id}"][data-status="running"]`);
        const mem = row?.querySelector('[data-testid="spark-memory"]');
        const cpu = row?.querySelector('[data-testid="spark-cpu"]');
        return Number(mem?.getAttribute("data-samples")) >= 2 && Number(cpu?.getAttribute("data-samples")) >= 1 &&
          (mem?.querySelector("polyline")?.getAttribute("points") ?? "") !== "";
      },
      serverId,
      { timeout: WAIT },
    );
    await shot(page, "instance-figures");
    await page.locator("#tab-agents").click();
  });

  await run("sessions", async () => {
    // The Sessions tab lists the page's session from the daemon's inventory (GET /v1/sessions).
    await page.locator("#tab-sessions").click();
    const row = byTestId(page, "sessions-table").locator(`tr[data-server-id="${serverId}"][data-state="live"]`);
    await row.first().waitFor({ timeout: WAIT });
    assert((await row.first().getAttribute("data-session-id"))?.length > 0, "the session row names its session id");
    await shot(page, "sessions");
    await page.locator("#tab-agents").click();
  });

  await run("5-crash", async () => {
    await sendPrompt(page, "/stderr last words from the mock");
    await turnEnds(page, 6);
    // After the crash the event stream ends and its resume is answered 410 (nothing left).
    allowed.push(["5-crash", "GET", new RegExp(`/v1/acp/${serverId}$`), 410]);
    await sendPrompt(page, "/crash 3");
    await page.locator('[data-testid="transcript"] [data-role="error"]', { hasText: "exited with code 3" }).waitFor({ timeout: WAIT });
    await page.locator("#tab-instances").click();
    const row = byTestId(page, "instances-table").locator(`tr[data-server-id="${serverId}"][data-status="exited"]`);
    await row.waitFor({ timeout: WAIT });
    const exitCode = await row.locator('[data-field="exit-code"]').textContent();
    if (exitCode !== "3") throw new Error(`the instance shows exit code ${exitCode}, expected 3`);
    await byTestId(page, "instances-table")
      .locator(`tr[data-stderr-of="${serverId}"] [data-field="stderr-tail"]`, { hasText: "last words from the mock" })
      .waitFor({ timeout: WAIT });
    await byTestId(page, "status").filter({ hasText: "ended" }).waitFor({ timeout: WAIT });
    // The stream's end and the client's attempt to resume it are in the log.
    await byTestId(page, "raw-log").locator('li[data-kind="reconnect"]').first().waitFor({ timeout: WAIT });
    await shot(page, "5-crash");
    // Stop removes it (DELETE) and the table says so.
    await byTestId(page, "instances-table").locator(`tr[data-server-id="${serverId}"] [data-testid="stop-button"]`).click();
    await row.waitFor({ state: "detached", timeout: WAIT });
  });

  await run("files-and-install", async () => {
    // The Rust test put notes/readme.txt in the daemon's work dir and checks the upload on disk.
    await page.locator("#tab-files").click();
    const list = byTestId(page, "files-list");
    await list.locator('li[data-name="notes"] button').click();
    await list.locator('li[data-name="readme.txt"] button').click();
    await byTestId(page, "file-view").filter({ hasText: "hello from the work dir" }).waitFor({ timeout: WAIT });
    await byTestId(page, "upload-input").setInputFiles({
      name: "uploaded.txt",
      mimeType: "text/plain",
      buffer: Buffer.from("uploaded through the inspector\n"),
    });
    await byTestId(page, "upload-button").click();
    await list.locator('li[data-name="uploaded.txt"]').waitFor({ timeout: WAIT });
    // The list is live: a file another client writes and removes comes and goes without a reload.
    await byTestId(page, "files-live").filter({ hasText: "live" }).waitFor({ timeout: WAIT });
    const dir = await byTestId(page, "files-path").inputValue();
    const other = (method, init = {}) =>
      fetch(`${baseUrl}/v1/fs/file?path=${encodeURIComponent(`${dir}/appeared.txt`)}`, {
        method,
        headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/octet-stream" },
        ...init,
      });
    assert((await other("PUT", { body: "written by someone else\n" })).ok, "PUT appeared.txt");
    await list.locator('li[data-name="appeared.txt"]').waitFor({ timeout: WAIT });
    const gone = await fetch(`${baseUrl}/v1/fs/entry?path=${encodeURIComponent(`${dir}/appeared.txt`)}`, {
      method: "DELETE",
      headers: { Authorization: `Bearer ${token}` },
    });
    assert(gone.ok, "DELETE appeared.txt");
    await list.locator('li[data-name="appeared.txt"]').waitFor({ state: "detached", timeout: WAIT });
    await shot(page, "files");
    await page.locator("#tab-agents").click();
  });

  await run("layout-and-credentials", async () => {
    // The whole status is readable: not cut off, at the test's width and at a narrow one.
    const statusCut = () =>
      byTestId(page, "status").evaluate((el) => el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1);
    if (await statusCut()) throw new Error("the status is cut off at 1366 px");
    await page.setViewportSize({ width: 900, height: 800 });
    const statusText = await byTestId(page, "status").textContent();
    if (await statusCut()) throw new Error(`the status is cut off at 900 px: ${statusText}`);
    await page.setViewportSize({ width: 1366, height: 800 });
    // A long id in the Instances column wraps only after its separators, never mid-word.
    const longId = "first-hour-instance-with-a-rather-long-server-id-0123456789";
    const made = await fetch(`${baseUrl}/v1/acp/${longId}?agent=mock`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", method: "hello" }),
    });
    if (made.status !== 202) throw new Error(`starting ${longId}: ${made.status}`);
    await page.locator("#tab-instances").click();
    const sid = byTestId(page, "instances-table").locator(`tr[data-server-id="${longId}"] [data-field="server-id"]`);
    await sid.waitFor({ timeout: WAIT });
    const breaks = await sid.evaluate((el) => {
      const text = el.textContent;
      const tops = [];
      const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        for (let i = 0; i < n.length; i++) {
          const r = document.createRange();
          r.setStart(n, i);
          r.setEnd(n, i + 1);
          tops.push(Math.round(r.getBoundingClientRect().top));
        }
      }
      const after = [];
      for (let i = 1; i < tops.length; i++) if (tops[i] > tops[i - 1]) after.push(text[i - 1]);
      return { lines: new Set(tops).size, after };
    });
    if (breaks.lines < 2) throw new Error(`the long id did not wrap at all (${JSON.stringify(breaks)}): the check proves nothing`);
    if (breaks.after.some((c) => !"-_.".includes(c))) throw new Error(`the id wraps mid-word: breaks after ${JSON.stringify(breaks.after)}`);
    await shot(page, "instances-long-id");
    await page.locator("#tab-agents").click();
  });

  await run("rich-updates", async () => {
    // The user agent `scripted` (ui/test/scripted-agent.mjs) streams a thought, a plan, a tool
    // call with a diff, in a fresh page.
    const other = await browser.newContext({ viewport: { width: 1366, height: 800 } });
    const p = await other.newPage();
    watch(p);
    allowed.push(["rich-updates", "GET", /\/v1\//, 401]); // before the token is entered
    allowedAborts.push(["rich-updates", "GET", /\/v1\/acp\/inspector-scripted-/]);
    await p.goto(`${baseUrl}/ui/`);
    await byTestId(p, "token-input").fill(token);
    await byTestId(p, "token-input").press("Enter");
    await p.locator('[data-testid="agent-select"] option[value="scripted"]').waitFor({ state: "attached", timeout: WAIT });
    await byTestId(p, "agent-select").selectOption("scripted");
    await byTestId(p, "connect-button").click();
    await byTestId(p, "status").filter({ hasText: "connected to scripted" }).waitFor({ timeout: WAIT });
    await p.locator("#init-info summary").click();
    await byTestId(p, "init-info").filter({ hasText: "Scripted login (scripted-login)" }).waitFor({ timeout: WAIT });
    await byTestId(p, "session-new-button").click();
    await byTestId(p, "session-id").filter({ hasText: "scripted-1" }).waitFor({ timeout: WAIT });
    await sendPrompt(p, "fix notes.txt");
    await turnEnds(p, 1);
    const t = byTestId(p, "transcript");
    await t.locator('[data-role="thought"]', { hasText: "the second line looks wrong" }).waitFor({ timeout: WAIT });
    const tool = t.locator('[data-role="tool-call"][data-tool-call-id="edit-1"][data-status="completed"]');
    await tool.filter({ hasText: "Edit notes.txt" }).waitFor({ timeout: WAIT });
    if ((await t.locator('[data-role="tool-call"]').count()) !== 1) throw new Error("the tool call was not updated in place");
    const diff = await tool.locator('[data-role="diff"] span').evaluateAll((ls) => ls.map((l) => `${l.className}|${l.textContent.trimEnd()}`));
    const expectedDiff = ["d-same|  one", "d-del|- two", "d-add|+ 2", "d-same|  three"];
    if (JSON.stringify(diff) !== JSON.stringify(expectedDiff)) throw new Error(`diff rendered as ${JSON.stringify(diff)}`);
    const plans = t.locator('[data-role="plan"]');
    if ((await plans.count()) !== 1) throw new Error("the second plan did not replace the first");
    const statuses = await plans.locator("li[data-status]").evaluateAll((ls) => ls.map((l) => l.dataset.status));
    if (JSON.stringify(statuses) !== JSON.stringify(["completed", "completed"])) throw new Error(`plan statuses ${statuses}`);
    await t.locator('[data-role="agent"]', { hasText: "fixed the second line" }).waitFor({ timeout: WAIT });
    // The method filter keeps only matching envelopes (and the non-envelope rows).
    await byTestId(p, "raw-filter").fill("session/new");
    const visible = await byTestId(p, "raw-log").locator("li[data-direction]:visible").evaluateAll((ls) => ls.map((l) => l.dataset.method));
    if (JSON.stringify(visible) !== JSON.stringify(["session/new", "session/new"])) throw new Error(`filtered rows ${JSON.stringify(visible)}`);
    await shot(p, "rich-updates");
    await byTestId(p, "raw-filter").fill("");
    // A prompt that fails for missing credentials says what the daemon knows the agent needs.
    await sendPrompt(p, "/auth");
    await t.locator('[data-role="error"]', { hasText: "Authentication required" }).waitFor({ timeout: WAIT });
    const hint = t.locator('[data-role="credentials-hint"]');
    await hint.filter({ hasText: "SCRIPTED_API_KEY" }).waitFor({ timeout: WAIT });
    const hintText = await hint.textContent();
    if (!hintText.includes("~/.scripted/credentials.json")) throw new Error(`the hint lacks the file: ${hintText}`);
    await shot(p, "credentials-hint");
    await byTestId(p, "disconnect-button").click();
    await byTestId(p, "status").filter({ hasText: "disconnected" }).waitFor({ timeout: WAIT });
    await other.close();
  });

  await run("slow-stream", async () => {
    // Through a proxy that holds every event-stream chunk for 300 ms, a prompt's answer arrives
    // before its updates: the turn's end must still be drawn after its last chunk.
    const proxy = await lagProxy(baseUrl, 300);
    const other = await browser.newContext({ viewport: { width: 1366, height: 800 } });
    const p = await other.newPage();
    watch(p);
    allowed.push(["slow-stream", "GET", /\/v1\//, 401]); // before the token is entered
    allowedAborts.push(["slow-stream", "GET", /\/v1\/acp\/inspector-mock-/]);
    try {
      await p.goto(`${proxy.url}/ui/`);
      await byTestId(p, "token-input").fill(token);
      await byTestId(p, "token-input").press("Enter");
      await p.locator('[data-testid="agent-select"] option[value="mock"]').waitFor({ state: "attached", timeout: WAIT });
      await byTestId(p, "connect-button").click();
      await byTestId(p, "status").filter({ hasText: "connected to mock" }).waitFor({ timeout: WAIT });
      await byTestId(p, "session-new-button").click();
      await byTestId(p, "session-id").filter({ hasText: "mock-" }).waitFor({ timeout: WAIT });
      await sendPrompt(p, "/stream 20");
      await turnEnds(p, 1);
      const roles = await byTestId(p, "transcript").locator("[data-role]").evaluateAll((ls) => ls.map((l) => l.dataset.role));
      const chunks = await byTestId(p, "transcript").locator('[data-role="agent"] .chunk').count();
      if (roles.at(-1) !== "turn-end" || roles.at(-2) !== "agent" || chunks !== 20) {
        throw new Error(`over a lagging stream the transcript reads ${JSON.stringify(roles)} with ${chunks} chunks`);
      }
      await byTestId(p, "disconnect-button").click();
      await byTestId(p, "status").filter({ hasText: "disconnected" }).waitFor({ timeout: WAIT });
    } finally {
      await other.close();
      await proxy.close();
    }
  });

  await run("6-wrong-token", async () => {
    const other = await browser.newContext({ viewport: { width: 1366, height: 800 } });
    const p = await other.newPage();
    watch(p);
    allowed.push(["6-wrong-token", "GET", /\/v1\//, 401]);
    await p.goto(`${baseUrl}/ui/`);
    await byTestId(p, "token-input").fill(`${token}-wrong`);
    await byTestId(p, "token-input").press("Enter");
    const notice = byTestId(p, "error").filter({ hasText: "refused this token" });
    await notice.waitFor({ timeout: WAIT });
    // Not a blank page: the controls are still there, and the status names the problem.
    await byTestId(p, "connect-button").waitFor({ state: "visible", timeout: WAIT });
    await byTestId(p, "status").filter({ hasText: "token refused" }).waitFor({ timeout: WAIT });
    await shot(p, "6-wrong-token");
    await other.close();
  });

  if (gapBaseUrl) {
    await run("gap", async () => {
      // An instance whose first 20 events were evicted before anyone read them.
      const id = "inspector-gap-demo";
      let n = 0;
      const post = async (method, params, query = "") => {
        const res = await fetch(`${gapBaseUrl}/v1/acp/${id}${query}`, {
          method: "POST",
          headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify({ jsonrpc: "2.0", id: ++n, method, params }),
        });
        if (res.status !== 200) throw new Error(`${method}: HTTP ${res.status} ${await res.text()}`);
        return (await res.json()).result;
      };
      await post("initialize", { protocolVersion: 1 }, "?agent=mock");
      const { sessionId } = await post("session/new", { cwd: "/", mcpServers: [] });
      await post("session/prompt", { sessionId, prompt: [{ type: "text", text: "/stream 30" }] });
      // And an instance this page never drove, which ended with exit code 4 after a stderr line.
      const crashed = "inspector-crashed-elsewhere";
      const call = async (method, params, query = "") =>
        fetch(`${gapBaseUrl}/v1/acp/${crashed}${query}`, {
          method: "POST",
          headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify({ jsonrpc: "2.0", id: ++n, method, params }),
        });
      await call("initialize", { protocolVersion: 1 }, "?agent=mock");
      const other_ = await (await call("session/new", { cwd: "/", mcpServers: [] })).json();
      const prompt = (text) => call("session/prompt", { sessionId: other_.result.sessionId, prompt: [{ type: "text", text }] });
      await prompt("/stderr a line the page never saw");
      const died = await prompt("/crash 4");
      if (died.status !== 502) throw new Error(`/crash 4 answered ${died.status}`);

      const other = await browser.newContext({ viewport: { width: 1366, height: 800 } });
      const p = await other.newPage();
      watch(p);
      allowed.push(["gap", "GET", /\/v1\//, 401]); // the page's first calls, before the token
      allowedAborts.push(["gap", "GET", new RegExp(`/v1/acp/${id}$`)]);
      await p.goto(`${gapBaseUrl}/ui/`);
      await byTestId(p, "token-input").fill(token);
      await byTestId(p, "token-input").press("Enter");
      await p.locator('[data-testid="agent-select"] option[value="mock"]').waitFor({ state: "attached", timeout: WAIT });
      // Attach from the Instances tab: the page joins the instance without starting anything.
      await p.locator("#tab-instances").click();
      await byTestId(p, "instances-table").locator(`tr[data-server-id="${id}"] [data-testid="attach-button"]`).click();
      await byTestId(p, "status").filter({ hasText: "connected to mock" }).waitFor({ timeout: WAIT });
      if ((await byTestId(p, "server-id-input").inputValue()) !== id) throw new Error("Attach did not fill the server id");
      const gap = byTestId(p, "raw-log").locator('li[data-kind="gap"]');
      await gap.waitFor({ timeout: WAIT });
      const text = await gap.textContent();
      if (!text.includes("events 1–20")) throw new Error(`the gap row says ${JSON.stringify(text)}`);
      // What was kept is replayed after the gap, in order: chunks 21..30.
      await p.locator('[data-testid="transcript"] [data-role="agent"] .chunk', { hasText: "chunk 30 of 30" }).waitFor({ timeout: WAIT });
      const chunks = await p.locator('[data-testid="transcript"] [data-role="agent"] .chunk').allTextContents();
      const expected = Array.from({ length: 10 }, (_, i) => `chunk ${i + 21} of 30`);
      if (JSON.stringify(chunks) !== JSON.stringify(expected)) throw new Error(`replayed chunks ${JSON.stringify(chunks)}`);
      await byTestId(p, "transcript").locator('[data-role="warn"]', { hasText: "were lost (gap)" }).waitFor({ timeout: WAIT });
      await shot(p, "gap");
      // The listing has no stderr tail: "Show stderr" asks the exited instance for its details.
      await p.locator("#tab-instances").click();
      const table = byTestId(p, "instances-table");
      await table.locator(`tr[data-server-id="${crashed}"][data-status="exited"]`).waitFor({ timeout: WAIT });
      await table.locator('[data-testid="stderr-button"]').click();
      await table.locator(`tr[data-stderr-of="${crashed}"] [data-field="stderr-tail"]`, { hasText: "a line the page never saw" }).waitFor({ timeout: WAIT });
      const code = await table.locator(`tr[data-server-id="${crashed}"] [data-field="exit-code"]`).textContent();
      if (code !== "4") throw new Error(`exit code shown: ${code}`);
      await shot(p, "other-instance");
      await p.locator("#tab-agents").click();
      // Disconnecting from an instance the page attached to leaves it running.
      await byTestId(p, "disconnect-button").click();
      await byTestId(p, "status").filter({ hasText: "detached from (still running)" }).waitFor({ timeout: WAIT });
      const listing = await (await fetch(`${gapBaseUrl}/v1/acp`, { headers: { Authorization: `Bearer ${token}` } })).json();
      const still = listing.servers.find((s) => s.serverId === id);
      if (still?.status !== "running") throw new Error(`after the detach the instance is ${JSON.stringify(still)}`);
      await other.close();
    });
  }

  await run("7-no-errors", async () => {
    const isAllowed = (e) => allowed.some(([s, m, re, status]) => s === e.step && m === e.method && re.test(new URL(e.url).pathname) && status === e.status);
    const bad = seen.badResponses.filter((e) => !isAllowed(e));
    // Chrome logs each of those allowed responses as "Failed to load resource: … status of N".
    const allowedLoads = seen.badResponses.filter(isAllowed);
    const consoleErrors = seen.console.filter(
      (c) =>
        !(
          /Failed to load resource: the server responded with a status of (\d+)/.test(c.text) &&
          allowedLoads.some((r) => r.step === c.step && r.url === c.url && c.text.includes(`status of ${r.status}`))
        ),
    );
    const failedRequests = seen.failedRequests.filter(
      (f) =>
        !(
          f.error === "net::ERR_ABORTED" &&
          // The Files tab ends the watch of a directory when it shows another one.
          ((f.method === "GET" && new URL(f.url).pathname === "/v1/fs/watch") ||
            allowedAborts.some(([s, m, re]) => s === f.step && m === f.method && re.test(new URL(f.url).pathname)))
        ),
    );
    const problems = { badResponses: bad, consoleErrors, pageErrors: seen.pageErrors, failedRequests };
    const count = bad.length + consoleErrors.length + seen.pageErrors.length + failedRequests.length;
    if (count) throw new Error(`the browser reported errors: ${JSON.stringify(problems, null, 2)}`);
  });
} catch (error) {
  failed = error;
  try {
    const pages = browser.contexts().flatMap((c) => c.pages());
    if (pages[0]) await pages[0].screenshot({ path: join(shots, `failed-${step}.png`) });
  } catch {
    // best effort
  }
} finally {
  await browser.close();
}

console.log(JSON.stringify({ steps: results, seen: { ...seen, allowed: allowed.map((a) => String(a)) } }));
if (failed) {
  console.error(`e2e: step ${step} failed: ${failed.stack ?? failed}`);
  process.exit(1);
}
process.exit(0);
