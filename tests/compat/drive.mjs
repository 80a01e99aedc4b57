// Drives the daemon with the published npm client `acp-http-client` (unchanged), against the
// built-in mock agent: initialize, session/new, prompts (one plain, two in parallel, one asking
// for permission), then disconnect (its DELETE). Prints one JSON line with what it saw.
// Usage: node drive.mjs <baseUrl> <serverId> [token]
import { AcpHttpClient } from "acp-http-client";

const [baseUrl, serverId, token] = process.argv.slice(2);
const updates = [];
const permissionRequests = [];
const client = new AcpHttpClient({
  baseUrl,
  token: token || undefined,
  transport: { path: `/v1/acp/${serverId}`, bootstrapQuery: { agent: "mock" } },
  client: {
    sessionUpdate: async (n) => {
      updates.push(n);
    },
    requestPermission: async (req) => {
      permissionRequests.push(req);
      return { outcome: { outcome: "selected", optionId: req.options[0].optionId } };
    },
  },
});

const texts = () =>
  updates
    .filter((u) => u.update?.sessionUpdate === "agent_message_chunk")
    .map((u) => u.update.content.text);

async function until(what, cond, ms = 5000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(texts())}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const init = await client.initialize();
const session = await client.newSession({ cwd: "/", mcpServers: [] });
const sessionId = session.sessionId;
const first = await client.prompt({ sessionId, prompt: [{ type: "text", text: "hello from npm" }] });
await until("the chunk of the first prompt", () => texts().includes("hello from npm"));
const parallel = await Promise.all([
  client.prompt({ sessionId, prompt: [{ type: "text", text: "/sleep 300" }] }),
  client.prompt({ sessionId, prompt: [{ type: "text", text: "/stream 3" }] }),
]);
await until("three streamed chunks", () => texts().includes("chunk 3 of 3"));
const perm = await client.prompt({ sessionId, prompt: [{ type: "text", text: "/permission" }] });
await until("the permission chunk", () => texts().some((t) => t.startsWith("permission:")));
await client.disconnect();

console.log(
  JSON.stringify({
    agentName: init.agentInfo?.name,
    protocolVersion: init.protocolVersion,
    sessionId,
    stopReasons: [first.stopReason, ...parallel.map((p) => p.stopReason), perm.stopReason],
    chunks: texts(),
    permissionRequests: permissionRequests.length,
  }),
);
process.exit(0);
