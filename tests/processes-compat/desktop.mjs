// Drives the daemon's /v1/desktop with the published npm SDK `sandbox-agent` (0.4.2, unchanged):
// every desktop method of its client against a real Xvfb. Prints one JSON line with what it saw;
// the Rust test (desktop::published_npm_sdk_drives_the_desktop_api) checks it.
// Usage: node desktop.mjs <baseUrl> <token> <displayNum> <typedFile>
import { SandboxAgent } from "sandbox-agent";

const [baseUrl, token, displayNum, typedFile] = process.argv.slice(2);
const sdk = await SandboxAgent.connect({ baseUrl, token });
const out = {};
const err = async (f) => {
  try {
    await f();
    return null;
  } catch (e) {
    return { status: e.status ?? e.problem?.status ?? null, message: String(e.message ?? e) };
  }
};
out.before = await sdk.getDesktopStatus();
out.notRunning = await err(() => sdk.moveDesktopMouse({ x: 1, y: 1 }));
out.started = await sdk.startDesktop({ displayNum: Number(displayNum), width: 800, height: 600 });
out.display = await sdk.getDesktopDisplayInfo();
const png = await sdk.takeDesktopScreenshot();
out.png = { length: png.length, magic: Buffer.from(png.slice(1, 4)).toString() };
const jpeg = await sdk.takeDesktopRegionScreenshot({ x: 0, y: 0, width: 100, height: 100, format: "jpeg" });
out.jpeg = { first: jpeg[0], second: jpeg[1] };
out.offScreen = await err(() => sdk.takeDesktopRegionScreenshot({ x: 790, y: 0, width: 100, height: 10 }));
out.moved = await sdk.moveDesktopMouse({ x: 50, y: 60 });
out.clicked = await sdk.clickDesktop({ x: 70, y: 80, button: "left", clickCount: 1 });
out.down = await sdk.mouseDownDesktop({ x: 10, y: 10 });
out.up = await sdk.mouseUpDesktop({ x: 20, y: 20 });
out.dragged = await sdk.dragDesktopMouse({ startX: 10, startY: 10, endX: 30, endY: 40 });
out.scrolled = await sdk.scrollDesktop({ x: 100, y: 100, deltaY: 2 });
out.position = await sdk.getDesktopMousePosition();
out.launched = await sdk.launchDesktopApp({
  app: "xterm",
  args: ["-u8", "-title", "sdk-term", "-e", "sh", "-c", `cat > ${typedFile}`],
  wait: true,
});
out.focused = await sdk.focusDesktopWindow(out.launched.windowId);
out.typed = await sdk.typeDesktopText({ text: "from the sdk" });
out.pressed = await sdk.pressDesktopKey({ key: "Return" });
out.keyDown = await sdk.keyDownDesktop({ key: "shift" });
out.keyUp = await sdk.keyUpDesktop({ key: "shift" });
out.badKey = await err(() => sdk.pressDesktopKey({ key: "NotAKeyName" }));
out.windows = await sdk.listDesktopWindows();
out.focusedWindow = await sdk.getDesktopFocusedWindow();
out.movedWindow = await sdk.moveDesktopWindow(out.launched.windowId, { x: 30, y: 40 });
out.resized = await sdk.resizeDesktopWindow(out.launched.windowId, { width: 400, height: 300 });
out.clipSet = await sdk.setDesktopClipboard({ text: "sdk clipboard ✓" });
out.clip = await sdk.getDesktopClipboard();
out.stream = await sdk.getDesktopStreamStatus();
out.recStarted = await sdk.startDesktopRecording({ fps: 10 });
await new Promise((r) => setTimeout(r, 2000));
out.recStopped = await sdk.stopDesktopRecording();
out.recordings = await sdk.listDesktopRecordings();
out.recording = await sdk.getDesktopRecording(out.recStarted.id);
const mp4 = await sdk.downloadDesktopRecording(out.recStarted.id);
out.mp4 = { length: mp4.length, ftyp: Buffer.from(mp4.slice(4, 8)).toString() };
await sdk.deleteDesktopRecording(out.recStarted.id);
out.afterDelete = await sdk.listDesktopRecordings();
out.stopped = await sdk.stopDesktop();
console.log(JSON.stringify(out));
