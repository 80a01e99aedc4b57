// One round of the TypeScript SDK for bench.py, against a daemon that is already running:
// node ts_driver.mjs URL SERVER_ID PROMPTS CHUNKS → one JSON line {"p50","p99","streamMs","cpuPerPrompt","streamCpuMs"} (the CPU this process used).
import { performance } from "node:perf_hooks";
import { SandboxAgentClient } from "../../typescript/packages/sandbox-agent/dist/index.js";

const [url, serverId, prompts, chunks] = process.argv.slice(2);
let got = 0;
const c = new SandboxAgentClient({ baseUrl: url, serverId, agent: "mock", onSessionUpdate: () => void got++ });
const { sessionId } = await c.newSession({ cwd: "/" });
for (let i = 0; i < 50; i++) await c.prompt({ sessionId, prompt: "warm up" });
const lat = [];
const cpu0 = process.cpuUsage();
for (let i = 0; i < Number(prompts); i++) {
  const t0 = performance.now();
  await c.prompt({ sessionId, prompt: "hello" });
  lat.push(performance.now() - t0);
}
const cpu1 = process.cpuUsage(cpu0);
const cpuPerPrompt = (cpu1.user + cpu1.system) / 1000 / Number(prompts);
lat.sort((a, b) => a - b);
const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
got = 0;
const cpu2 = process.cpuUsage();
const t0 = performance.now();
await c.prompt({ sessionId, prompt: `/stream ${chunks}` });
const streamMs = performance.now() - t0;
const cpu3 = process.cpuUsage(cpu2);
const streamCpuMs = (cpu3.user + cpu3.system) / 1000;
if (got !== Number(chunks)) throw new Error(`${got} of ${chunks} updates when prompt() resolved`);
await c.disconnect();
console.log(JSON.stringify({ p50: q(0.5), p99: q(0.99), streamMs, cpuPerPrompt, streamCpuMs }));
