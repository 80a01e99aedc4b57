// Desktop benchmarks (docs/performance.md, "Desktop"), ours and the reference's side by side on
// this machine: screenshot latency (PNG, p50/p99) at 1280×720 and 1920×1080, the input round trip
// (POST mouse/move, then GET mouse/position until it reads the new point), and our live view's
// frames/s and bytes/s (the reference's live view is WebRTC, not comparable). Each daemon gets its
// own display and is stopped at the end. Not a test: it asserts nothing, it prints a table.
// Usage: node benches/desktop.mjs <our binary> [<reference binary>]   (benches/desktop.sh runs it)
// Knobs: DESK_BENCH_SHOTS (default 40), DESK_BENCH_MOVES (100), DESK_BENCH_VIEW_SECS (5).
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket from "../sdks/typescript/node_modules/ws/index.js";

const [ours, ref] = process.argv.slice(2);
const SHOTS = Number(process.env.DESK_BENCH_SHOTS ?? 40);
const MOVES = Number(process.env.DESK_BENCH_MOVES ?? 100);
const VIEW_SECS = Number(process.env.DESK_BENCH_VIEW_SECS ?? 5);

function freePort() {
  return new Promise((res) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => res(p));
    });
  });
}

async function daemon(kind, bin) {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), `desk-bench-${kind}-`));
  const args =
    kind === "ours"
      ? ["server", "--host", "127.0.0.1", "--no-token", "--log-level", "warn", "--port", String(port), "--work-dir", dir, "--data-dir", join(dir, "data")]
      : ["server", "--no-token", "--no-telemetry", "--port", String(port)];
  const child = spawn(bin, args, { stdio: "ignore", env: { ...process.env, HOME: dir, RUST_LOG: "warn" }, cwd: dir });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      await fetch(`${base}/v1/health`);
      break;
    } catch {
      if (i > 200) throw new Error(`${kind} did not come up`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return { kind, base, child };
}

async function call(d, method, path, body) {
  const res = await fetch(`${d.base}${path}`, {
    method,
    headers: body ? { "Content-Type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const buf = Buffer.from(await res.arrayBuffer());
  if (!res.ok) throw new Error(`${d.kind} ${method} ${path}: ${res.status} ${buf.toString().slice(0, 300)}`);
  return buf;
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
};
const ms = (x) => x.toFixed(1);

async function bench(d, display, width, height) {
  await call(d, "POST", "/v1/desktop/start", { displayNum: display, width, height });
  const shots = [];
  let size = 0;
  for (let i = 0; i < SHOTS; i++) {
    const t = performance.now();
    const b = await call(d, "GET", "/v1/desktop/screenshot");
    shots.push(performance.now() - t);
    size = b.length;
  }
  const moves = [];
  for (let i = 0; i < MOVES; i++) {
    const x = 10 + (i % 50) * 7;
    const y = 10 + (i % 30) * 5;
    const t = performance.now();
    await call(d, "POST", "/v1/desktop/mouse/move", { x, y });
    for (;;) {
      const p = JSON.parse(await call(d, "GET", "/v1/desktop/mouse/position"));
      if (p.x === x && p.y === y) break;
    }
    moves.push(performance.now() - t);
  }
  let view = null;
  if (d.kind === "ours") {
    view = await new Promise((res, rej) => {
      const ws = new WebSocket(`${d.base.replace("http", "ws")}/v1/desktop/stream/frames?fps=10&quality=60`);
      let frames = 0;
      let bytes = 0;
      let t0 = 0;
      ws.on("message", (data, binary) => {
        if (!binary) {
          t0 = performance.now();
          return;
        }
        frames += 1;
        bytes += data.length;
      });
      ws.on("error", rej);
      setTimeout(() => {
        const secs = (performance.now() - t0) / 1000;
        ws.close();
        res({ fps: frames / secs, bps: bytes / secs, frame: bytes / Math.max(frames, 1) });
      }, VIEW_SECS * 1000);
    });
  }
  await call(d, "POST", "/v1/desktop/stop");
  return { shots, size, moves, view };
}

const rows = [];
const sides = [["ours", ours]];
if (ref) sides.push(["reference", ref]);
let display = 181;
for (const [kind, bin] of sides) {
  const d = await daemon(kind, bin);
  try {
    for (const [w, h] of [[1280, 720], [1920, 1080]]) {
      const r = await bench(d, display++, w, h);
      const row = {
        daemon: kind,
        screen: `${w}x${h}`,
        "png p50 ms": ms(pct(r.shots, 50)),
        "png p99 ms": ms(pct(r.shots, 99)),
        "png KiB": (r.size / 1024).toFixed(0),
        "move→read p50 ms": ms(pct(r.moves, 50)),
        "move→read p99 ms": ms(pct(r.moves, 99)),
        "view fps (asked 10)": r.view ? r.view.fps.toFixed(1) : "n/a (WebRTC)",
        "view KiB/s": r.view ? (r.view.bps / 1024).toFixed(0) : "n/a",
        "KiB/frame": r.view ? (r.view.frame / 1024).toFixed(0) : "n/a",
      };
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  } finally {
    d.child.kill("SIGTERM");
  }
}
console.table(rows);
console.log(JSON.stringify(rows));
