// Drives a real agent through the daemon with the published npm client `acp-http-client`
// (unchanged): initialize, session/new in <cwd>, one prompt that the fake model answers with
// streamed text, then disconnect (its DELETE). Prints one JSON line with what it saw.
// Usage: node real-turn.mjs <baseUrl> <serverId> <agent> <cwd>
import { AcpHttpClient } from "acp-http-client";

const [baseUrl, serverId, agent, cwd] = process.argv.slice(2);
const updates = [];
const client = new AcpHttpClient({
  baseUrl,
  transport: { path: `/v1/acp/${serverId}`, bootstrapQuery: { agent } },
  client: {
    sessionUpdate: async (n) => {
      updates.push(n);
    },
    requestPermission: async () => ({ outcome: { outcome: "cancelled" } }),
  },
});

const texts = () =>
  updates
    .filter((u) => u.update?.sessionUpdate === "agent_message_chunk")
    .map((u) => u.update.content.text)
    .join("");

const init = await client.initialize({ protocolVersion: 1, clientCapabilities: {} });
const session = await client.newSession({ cwd, mcpServers: [] });
const result = await client.prompt({
  sessionId: session.sessionId,
  prompt: [{ type: "text", text: "hello through the npm client [[text]]" }],
});
const deadline = Date.now() + 10000;
while (!texts().includes("three") && Date.now() < deadline) {
  await new Promise((r) => setTimeout(r, 20));
}
await client.disconnect();
console.log(
  JSON.stringify({ agentName: init.agentInfo?.name, stopReason: result.stopReason, text: texts() }),
);
process.exit(0);
