// A small real ACP agent over stdio (newline-delimited JSON-RPC) for the inspector's browser test:
// each prompt streams the update kinds the built-in mock never sends — a thought, a plan, a tool
// call going pending → in_progress → completed with a diff, the plan again (completed) — then a
// message chunk, and ends the turn. `initialize` advertises one auth method, so the page has one
// to show. Registered through `--agents-file` as the user agent `scripted`.
import { createInterface } from "node:readline";

const send = (msg) => process.stdout.write(`${JSON.stringify({ jsonrpc: "2.0", ...msg })}\n`);
const update = (sessionId, u) => send({ method: "session/update", params: { sessionId, update: u } });
let sessions = 0;

const plan = (status) => ({
  sessionUpdate: "plan",
  entries: [
    { content: "read notes.txt", priority: "high", status: "completed" },
    { content: "fix the second line", priority: "medium", status },
  ],
});

for await (const line of createInterface({ input: process.stdin })) {
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    continue;
  }
  const { id, method, params } = msg;
  if (method === "initialize") {
    send({
      id,
      result: {
        protocolVersion: 1,
        agentCapabilities: { loadSession: false },
        agentInfo: { name: "scripted", title: "Scripted agent", version: "1.0.0" },
        authMethods: [{ id: "scripted-login", name: "Scripted login", description: "not needed here" }],
      },
    });
  } else if (method === "session/new") {
    send({ id, result: { sessionId: `scripted-${++sessions}` } });
  } else if (method === "session/prompt" && JSON.stringify(params.prompt).includes("/auth")) {
    // What a real agent answers when it has no key.
    send({ id, error: { code: -32000, message: "Authentication required" } });
  } else if (method === "session/prompt") {
    const s = params.sessionId;
    update(s, { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "the second line looks wrong" } });
    update(s, plan("in_progress"));
    update(s, { sessionUpdate: "tool_call", toolCallId: "edit-1", title: "Edit notes.txt", kind: "edit", status: "pending" });
    update(s, { sessionUpdate: "tool_call_update", toolCallId: "edit-1", status: "in_progress" });
    update(s, {
      sessionUpdate: "tool_call_update",
      toolCallId: "edit-1",
      status: "completed",
      content: [{ type: "diff", path: "/work/notes.txt", oldText: "one\ntwo\nthree", newText: "one\n2\nthree" }],
    });
    update(s, plan("completed"));
    update(s, { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "fixed the second line" } });
    send({ id, result: { stopReason: "end_turn" } });
  } else if (id !== undefined && method !== undefined) {
    send({ id, error: { code: -32601, message: `Method not found: ${method}` } });
  }
}
