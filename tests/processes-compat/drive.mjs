// Drives the daemon's /v1/processes with the published npm SDK `sandbox-agent` (0.4.2, unchanged):
// config get/set, run, create (pipes and tty), list, get, logs, follow, input, resize, the terminal
// WebSocket (token in its URL), stop, kill, delete. Prints one JSON line with what it saw; the Rust test checks it.
// Usage: node drive.mjs <baseUrl> [token]
import { SandboxAgent } from "sandbox-agent";
import WS from "ws";

const [baseUrl, token] = process.argv.slice(2);
const sdk = await SandboxAgent.connect({ baseUrl, token: token || undefined });
const text = (entries) =>
  entries.map((e) => Buffer.from(e.data, e.encoding === "base64" ? "base64" : "utf8").toString()).join("");

async function until(what, cond, ms = 10000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const out = {};
// Its installer call: the client's type is `{ already_installed: boolean, artifacts }`.
out.installMock = await sdk.installAgent("mock");
const config = await sdk.getProcessConfig();
out.config = config;
out.configSet = await sdk.setProcessConfig({ ...config, maxOutputBytes: 4096 });
out.run = await sdk.runProcess({ command: "sh", args: ["-c", "echo out; echo err >&2; exit 3"] });
out.runTimeout = await sdk.runProcess({ command: "sleep", args: ["10"], timeoutMs: 200 });
const big = await sdk.runProcess({ command: "head", args: ["-c", "10000", "/dev/zero"] });
out.runTruncated = { stdoutLength: big.stdout.length, stdoutTruncated: big.stdoutTruncated, exitCode: big.exitCode };
await sdk.setProcessConfig(config);

// A background process with stdin, followed while it runs.
const cat = await sdk.createProcess({ command: "cat", interactive: true });
out.created = cat;
const followed = [];
const follow = await sdk.followProcessLogs(cat.id, (entry) => followed.push(entry));
out.input = await sdk.sendProcessInput(cat.id, { data: Buffer.from("ping\n").toString("base64"), encoding: "base64" });
await until("the echoed input", () => text(followed).includes("ping\n"));
out.followedText = text(followed);
out.listed = (await sdk.listProcesses()).processes.map((p) => p.id);
out.got = await sdk.getProcess(cat.id);
out.logs = await sdk.getProcessLogs(cat.id, { stream: "stdout" });
out.stopped = await sdk.stopProcess(cat.id, { waitMs: 5000 });
await follow.closed;
await sdk.deleteProcess(cat.id);
try {
  await sdk.getProcess(cat.id);
  out.afterDelete = "still there";
} catch (e) {
  out.afterDelete = e.status;
}

// A terminal.
const tty = await sdk.createProcess({ command: "bash", args: ["--norc", "--noprofile"], tty: true, interactive: true });
out.ttyId = tty.id;
out.resize = await sdk.resizeProcessTerminal(tty.id, { cols: 123, rows: 45 });
await sdk.sendProcessInput(tty.id, { data: "stty size\n", encoding: "utf8" });
out.ttyText = await until("stty's answer", async () => {
  const t = text((await sdk.getProcessLogs(tty.id)).entries);
  return t.includes("45 123") ? t : null;
});

// The same terminal over the SDK's WebSocket: it sends the token as `?access_token=` (browsers
// cannot set headers on a WebSocket). Node 20 has no global WebSocket; `ws` is passed in.
const term = sdk.connectProcessTerminal(tty.id, { WebSocket: globalThis.WebSocket ?? WS });
let wsText = "";
const wsErrors = [];
term.onData((bytes) => (wsText += Buffer.from(bytes).toString()));
term.onError((e) => wsErrors.push(String(e?.message ?? e)));
out.wsReady = await new Promise((resolve, reject) => {
  term.onReady(resolve);
  term.onClose(() => reject(new Error(`terminal socket closed before ready: ${wsErrors.join("; ")}`)));
});
term.resize({ cols: 77, rows: 22 });
term.sendInput("tty; stty size\n");
await until("tty and stty over the WebSocket", () => /\/dev\/pts\/\d+/.test(wsText) && wsText.includes("22 77"));
out.wsText = wsText;
term.close();
await term.closed;
out.killed = await sdk.killProcess(tty.id, { waitMs: 5000 });
try {
  await sdk.deleteProcess("proc_999999");
} catch (e) {
  out.deleteUnknown = e.status;
}
await sdk.dispose();
console.log(JSON.stringify(out));
