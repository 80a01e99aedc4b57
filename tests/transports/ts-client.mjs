// Drives the official TypeScript ACP SDK's HTTP or WebSocket client (unmodified) against
// `/v1/agents/mock/acp`: initialize → session/new → prompt with streamed updates → a permission
// request answered → cancel of a `/hang` prompt → close. Prints one JSON line with what it saw;
// exits non-zero on any failure. Usage: node ts-client.mjs http|ws <base-url> [token]
import * as acp from "@agentclientprotocol/sdk";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import WebSocket from "ws";

const [mode, base, token] = process.argv.slice(2);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const deadline = setTimeout(() => {
  console.error("timed out");
  process.exit(3);
}, 30_000);

const url = `${base}/v1/agents/mock/acp`;
const stream =
  mode === "ws"
    ? createWebSocketStream(url.replace(/^http/, "ws"), { WebSocket, headers })
    : createHttpStream(url, { headers });

const updates = [];
let permissionAsked = 0;
const conn = acp
  .client({ name: "interop-ts" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    updates.push(params);
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    permissionAsked += 1;
    const allow = params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  })
  .connect(stream);

const agent = conn.agent;
const textsOf = (sessionId) =>
  updates
    .filter((u) => u.sessionId === sessionId && u.update.sessionUpdate === "agent_message_chunk")
    .map((u) => u.update.content.text);

const init = await agent.request(acp.methods.agent.initialize, {
  protocolVersion: 1,
  clientCapabilities: {},
});
const { sessionId } = await agent.request(acp.methods.agent.session.new, {
  cwd: "/tmp",
  mcpServers: [],
});
const streamed = await agent.request(acp.methods.agent.session.prompt, {
  sessionId,
  prompt: [{ type: "text", text: "/stream 3" }],
});
const permission = await agent.request(acp.methods.agent.session.prompt, {
  sessionId,
  prompt: [{ type: "text", text: "/permission" }],
});
const hang = agent.request(acp.methods.agent.session.prompt, {
  sessionId,
  prompt: [{ type: "text", text: "/hang" }],
});
// Cancel only once the daemon has written the prompt to the agent (a request in flight).
for (let i = 0; ; i++) {
  const { servers } = await (await fetch(`${base}/v1/acp`, { headers })).json();
  if (servers.some((s) => s.pendingRequests > 0)) break;
  if (i > 1000) throw new Error("the /hang prompt never reached the agent");
  await new Promise((r) => setTimeout(r, 10));
}
await agent.notify(acp.methods.agent.session.cancel, { sessionId });
const cancelled = await hang;
const result = {
  agent: init.agentInfo?.name,
  sessionId,
  streamedStop: streamed.stopReason,
  texts: textsOf(sessionId),
  permissionAsked,
  permissionStop: permission.stopReason,
  cancelledStop: cancelled.stopReason,
};
conn.close();
await conn.closed.catch(() => {});
clearTimeout(deadline);
console.log(JSON.stringify(result));
// The HTTP client's DELETE is sent by close(); give nothing else a chance to keep the loop alive.
process.exit(0);
