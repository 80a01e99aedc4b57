// The SDK's desktop client (`host.desktop`) against the real daemon on a real Xvfb: status and
// start, a PNG of the right size, an xterm launched through the API that receives typed text
// (observed in a file it writes), problems as HttpError (400 for an unknown key, 409 after stop),
// a recording downloaded as MP4 bytes and deleted, and the live view: the ready size, JPEG frames,
// pointer input over the socket read back through the HTTP route, a refused input reported.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execSync } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WS from "ws";
import { HostApi, HttpError } from "sandbox-agent";
import { startDaemon, eventually, binaryExists, BIN, skipOrFail } from "./support.mjs";

const TOKEN = "desk-tok";
const WebSocket = globalThis.WebSocket ?? WS;
const TOOLS = ["Xvfb", "openbox", "xdotool", "xclip", "ffmpeg", "xprop", "xterm"];
const missing = TOOLS.filter((t) => {
  try {
    execSync(`command -v ${t}`, { stdio: "ignore", shell: "/bin/sh" });
    return false;
  } catch {
    return true;
  }
});

let d;
let host;
before(async () => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
  if (missing.length) return;
  d = await startDaemon({ token: TOKEN });
  host = new HostApi({ baseUrl: d.url, token: TOKEN });
});
after(async () => {
  await d?.stop();
});

function pngSize(b) {
  assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], "not a PNG");
  const v = new DataView(b.buffer, b.byteOffset);
  return [v.getUint32(16), v.getUint32(20)];
}

test("desktop: start, screenshot, xterm typed into, problems, recording, live view, stop", async (t) => {
  if (missing.length) return skipOrFail(t, `missing ${missing.join(", ")}; run .ci/install-desktop.sh`);
  const desk = host.desktop;
  const before = await desk.status();
  assert.ok(["inactive", "install_required"].includes(before.state), before.state);
  await assert.rejects(desk.mouseMove({ x: 1, y: 1 }), (e) => e instanceof HttpError && e.status === 409);

  const s = await desk.start({ displayNum: 171, width: 480, height: 320 });
  assert.equal(s.state, "active");
  assert.equal(s.display, ":171");
  assert.deepEqual((await desk.displayInfo()).resolution?.width, 480);
  assert.deepEqual(pngSize(await desk.screenshot()), [480, 320]);
  const jpeg = await desk.screenshotRegion({ x: 0, y: 0, width: 100, height: 50, format: "jpeg" });
  assert.deepEqual([...jpeg.subarray(0, 2)], [0xff, 0xd8]);
  await assert.rejects(
    desk.screenshotRegion({ x: 400, y: 0, width: 100, height: 50 }),
    (e) => e instanceof HttpError && e.status === 400,
  );

  // An xterm whose shell writes the line it reads to a file.
  const out = join(mkdtempSync(join(tmpdir(), "desk-sdk-")), "typed.txt");
  const launched = await desk.launch({
    app: "xterm",
    args: ["-geometry", "40x10+0+0", "-e", "sh", "-c", `read line; printf %s "$line" > ${out}`],
    wait: true,
  });
  assert.ok(launched.windowId, "the xterm's window");
  await desk.focusWindow(launched.windowId);
  await desk.typeText({ text: "héllo sdk" });
  await desk.pressKey({ key: "Return" });
  const typed = await eventually(() => (existsSync(out) ? readFileSync(out, "utf8") : null), { what: "the typed file" });
  assert.equal(typed, "héllo sdk");
  await assert.rejects(desk.pressKey({ key: "NoSuchKeyName" }), (e) => e instanceof HttpError && e.status === 400);

  const moved = await desk.mouseMove({ x: 30, y: 40 });
  assert.deepEqual([moved.x, moved.y], [30, 40]);
  await desk.setClipboard({ text: "clip ✓" });
  assert.equal((await desk.getClipboard()).text, "clip ✓");

  const rec = await desk.startRecording({ fps: 5 });
  assert.equal(rec.status, "recording");
  await new Promise((r) => setTimeout(r, 1200));
  const done = await desk.stopRecording();
  assert.equal(done.status, "completed");
  const mp4 = await desk.downloadRecording(done.id);
  assert.equal(Buffer.from(mp4.subarray(4, 8)).toString(), "ftyp");
  assert.ok((await desk.listRecordings()).some((r) => r.id === done.id));
  await desk.deleteRecording(done.id);
  await assert.rejects(desk.getRecording(done.id), (e) => e instanceof HttpError && e.status === 404);

  assert.equal((await desk.streamStatus()).active, false);
  assert.match(desk.liveViewUrl({ fps: 2 }, "t"), /^ws:\/\/.*\/v1\/desktop\/stream\/frames\?fps=2&access_token=t$/);
  const view = desk.connectLiveView({ fps: 5, quality: 50 }, { WebSocket });
  const ready = await view.ready;
  assert.deepEqual([ready.width, ready.height], [480, 320]);
  const frame = await new Promise((res) => {
    const off = view.onFrame((f) => {
      off();
      res(f);
    });
  });
  assert.deepEqual([...frame.subarray(0, 2)], [0xff, 0xd8], "a JPEG frame");
  view.move(123, 45);
  await eventually(async () => {
    const p = await desk.mousePosition();
    return p.x === 123 && p.y === 45 ? p : null;
  }, { what: "the pointer moved by the live view" });
  const refused = new Promise((res) => view.onError(res));
  view.send({ type: "move", x: 99999, y: 1 });
  assert.match(await refused, /x/);
  const ended = new Promise((res) => view.onEnd(res));
  const stopped = await desk.stop();
  assert.equal(stopped.state, "inactive");
  await ended;
  await view.closed;
  await assert.rejects(desk.screenshot(), (e) => e instanceof HttpError && e.status === 409);
});
