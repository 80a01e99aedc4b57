import { SandboxAgent } from "sandbox-agent";
import { docker } from "sandbox-agent/docker";
const t0 = Date.now();
const sa = await SandboxAgent.start({ sandbox: docker({ image: process.env.IMG }) });
console.log("started", sa.sandboxId, Date.now() - t0);
console.log(await sa.getHealth());
try {
const s = await sa.createSession({ agent: "mock" });
s.onEvent?.((e) => console.log("event", JSON.stringify(e).slice(0, 200)));
console.log("session", s.id);
const r = await s.prompt([{ type: "text", text: "hi" }]);
console.log("prompt", JSON.stringify(r));
} catch (e) { console.log("ERR", e); }
await sa.destroySandbox();
console.log("destroyed", Date.now() - t0);
