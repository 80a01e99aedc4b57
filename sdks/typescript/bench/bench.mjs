// SDK overhead benchmark (not a test): the same daemon and mock agent driven three ways —
// raw fetch (hand-written POST + SSE reader), acp-http-client, and sandbox-agent — for
// (1) prompt round trips at concurrency 1 and (2) one prompt streaming 10,000 chunks.
// Usage: npm run bench [-- --rounds N --prompts N --chunks N --max-load L --load-wait S];
// SANDBOX_AGENT_BIN picks the daemon (docs/performance.md's figures use target/release).
// On a shared machine `--max-load L` waits (at most S seconds, default 600) before each round until
// the 1-minute load average is under L; the load at each round's start is printed with the table.
// Prints a Markdown table; figures go to docs/performance.md.
import { loadavg } from "node:os";
import { performance } from "node:perf_hooks";
import { AcpHttpClient } from "acp-http-client";
import { SandboxAgentClient } from "sandbox-agent";
import { startDaemon, BIN } from "../test/support.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i === -1 ? dflt : Number(process.argv[i + 1]);
};
const ROUNDS = arg("rounds", 3);
const PROMPTS = arg("prompts", 500);
const CHUNKS = arg("chunks", 10_000);
const MAX_LOAD = arg("max-load", Infinity);
const LOAD_WAIT_MS = arg("load-wait", 600) * 1000;

/** Waits (bounded) until the 1-minute load average is under MAX_LOAD; returns the load then. */
async function quietEnough() {
  const deadline = Date.now() + LOAD_WAIT_MS;
  while (loadavg()[0] >= MAX_LOAD && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5000));
  return loadavg()[0];
}

/** The minimal client a user would write by hand: POST each envelope, parse SSE frames. */
class RawClient {
  constructor(baseUrl, serverId) {
    this.url = `${baseUrl}/v1/acp/${serverId}`;
    this.nextId = 0;
    this.onUpdate = () => {};
    this.abort = new AbortController();
  }
  async request(method, params, first = false) {
    const res = await fetch(first ? `${this.url}?agent=mock` : this.url, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: this.nextId++, method, params }),
    });
    if (res.status !== 200) throw new Error(`POST ${res.status}`);
    const msg = await res.json();
    if (msg.error) throw new Error(msg.error.message);
    return msg.result;
  }
  async startEvents() {
    const res = await fetch(this.url, { headers: { accept: "text/event-stream" }, signal: this.abort.signal });
    (async () => {
      const dec = new TextDecoder();
      let buf = "";
      try {
        for await (const chunk of res.body) {
          buf += dec.decode(chunk, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) !== -1) {
            const frame = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const data = frame.split("\n").find((l) => l.startsWith("data: "));
            if (data) this.onUpdate(JSON.parse(data.slice(6)));
          }
        }
      } catch {
        // aborted at the end
      }
    })();
  }
  async close() {
    this.abort.abort();
    await fetch(this.url, { method: "DELETE" });
  }
}

function stats(samples) {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  return { p50: q(0.5), p99: q(0.99), mean: s.reduce((a, b) => a + b, 0) / s.length };
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function rawSetup(url, n) {
  const c = new RawClient(url, `bench-raw-${n}`);
  await c.request("initialize", { protocolVersion: 1, clientCapabilities: {} }, true);
  await c.startEvents();
  const { sessionId } = await c.request("session/new", { cwd: "/", mcpServers: [] });
  return { c, sessionId };
}

async function main() {
  const d = await startDaemon({ args: ["--log-level", "warn,sandbox_agent::daemon=info"] });
  const rows = [];
  const loads = [];
  const perRound = [];
  try {
    const drivers = {
      "raw fetch": async (n) => {
        const { c, sessionId } = await rawSetup(d.url, n);
        let got = 0;
        c.onUpdate = (m) => {
          if (m.method === "session/update") got++;
        };
        return {
          prompt: (text) => c.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] }),
          // Raw fetch has no ordering help: wait (polling) until every chunk arrived on SSE.
          stream: async (k) => {
            got = 0;
            await c.request("session/prompt", { sessionId, prompt: [{ type: "text", text: `/stream ${k}` }] });
            while (got < k) await new Promise((r) => setImmediate(r));
          },
          close: () => c.close(),
        };
      },
      "acp-http-client": async (n) => {
        let got = 0;
        const c = new AcpHttpClient({
          baseUrl: d.url, serverId: `bench-acp-${n}`, agent: "mock",
          client: { sessionUpdate: () => void got++ },
        });
        await c.initialize();
        const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
        return {
          prompt: (text) => c.prompt({ sessionId, prompt: [{ type: "text", text }] }),
          stream: async (k) => {
            got = 0;
            await c.prompt({ sessionId, prompt: [{ type: "text", text: `/stream ${k}` }] });
            while (got < k) await new Promise((r) => setImmediate(r));
          },
          close: () => c.close(),
        };
      },
      "sandbox-agent": async (n) => {
        let got = 0;
        const c = new SandboxAgentClient({
          baseUrl: d.url, serverId: `bench-sdk-${n}`, agent: "mock", onSessionUpdate: () => void got++,
        });
        const { sessionId } = await c.newSession({ cwd: "/" });
        return {
          // prompt() resolves only once its updates were delivered (one GET /v1/acp per prompt).
          prompt: (text) => c.prompt({ sessionId, prompt: text }),
          stream: async (k) => {
            got = 0;
            await c.prompt({ sessionId, prompt: `/stream ${k}` });
            if (got !== k) throw new Error(`sandbox-agent: ${got} of ${k} updates at resolve`);
          },
          close: () => c.disconnect(),
        };
      },
      "sandbox-agent (waitForUpdates: false)": async (n) => {
        let got = 0;
        const c = new SandboxAgentClient({
          baseUrl: d.url, serverId: `bench-sdknw-${n}`, agent: "mock", waitForUpdates: false,
          onSessionUpdate: () => void got++,
        });
        const { sessionId } = await c.newSession({ cwd: "/" });
        return {
          prompt: (text) => c.prompt({ sessionId, prompt: text }),
          stream: async (k) => {
            got = 0;
            await c.prompt({ sessionId, prompt: `/stream ${k}` });
            while (got < k) await new Promise((r) => setImmediate(r));
          },
          close: () => c.disconnect(),
        };
      },
    };
    // Rounds interleave the clients, so drift on a shared machine hits them alike.
    const results = Object.fromEntries(Object.keys(drivers).map((k) => [k, { p50s: [], p99s: [], streams: [] }]));
    for (let r = 0; r < ROUNDS; r++) {
      loads.push((await quietEnough()).toFixed(2));
      for (const [name, make] of Object.entries(drivers)) {
        const res = results[name];
        const drv = await make(r);
        for (let i = 0; i < 50; i++) await drv.prompt("warm up");
        const lat = [];
        for (let i = 0; i < PROMPTS; i++) {
          const t0 = performance.now();
          await drv.prompt("hello");
          lat.push(performance.now() - t0);
        }
        const s = stats(lat);
        res.p50s.push(s.p50);
        res.p99s.push(s.p99);
        const t0 = performance.now();
        await drv.stream(CHUNKS);
        res.streams.push(performance.now() - t0);
        perRound.push([r + 1, loads[r], name, s.p50.toFixed(2), s.p99.toFixed(2), res.streams.at(-1).toFixed(0)]);
        await drv.close();
      }
    }
    const raw = results["raw fetch"];
    for (const [name, res] of Object.entries(results)) {
      const ms = median(res.streams);
      rows.push([
        name,
        median(res.p50s).toFixed(2),
        median(res.p99s).toFixed(2),
        ms.toFixed(0),
        Math.round(CHUNKS / (ms / 1000)),
        `${(median(res.p50s) / median(raw.p50s)).toFixed(2)}×`,
        `${(median(raw.streams) / ms).toFixed(2)}×`,
      ]);
    }
  } finally {
    await d.stop();
  }
  console.log(`daemon: ${BIN}; node ${process.version}; ${ROUNDS} rounds (median shown), ${PROMPTS} prompts each, ${CHUNKS} chunks`);
  console.log(`load average (1 min) at each round's start: ${loads.join(", ")}; at the end: ${loadavg()[0].toFixed(2)}\n`);
  console.log(`| client | prompt p50 (ms) | prompt p99 (ms) | ${CHUNKS} chunks (ms) | chunks/s | p50 vs raw | chunks/s vs raw |`);
  console.log("|---|---|---|---|---|---|---|");
  for (const r of rows) console.log(`| ${r.join(" | ")} |`);
  console.log(`\nPer round:\n\n| round | load at start | client | prompt p50 (ms) | prompt p99 (ms) | ${CHUNKS} chunks (ms) |`);
  console.log("|---|---|---|---|---|---|");
  for (const r of perRound) console.log(`| ${r.join(" | ")} |`);
}

await main();
