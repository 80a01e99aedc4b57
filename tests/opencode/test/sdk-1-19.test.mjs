// The current @opencode-ai/sdk (1.19), its v2 client: flat parameters, permission and question
// requests, the global event stream.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createOpencodeClient } from "@opencode-ai/sdk/v2";
import { startDaemon, collect, textOf } from "./daemon.mjs";

let d;
let client;
before(async () => {
  d = await startDaemon();
  client = createOpencodeClient({ baseUrl: d.url, headers: d.headers });
});
after(async () => { await d?.stop(); });

const body = (text) => ({ model: { providerID: "mock", modelID: "mock" }, parts: [{ type: "text", text }] });

test("1.19: create, prompt, status and messages", async () => {
  const made = await client.session.create({ title: "current sdk" });
  assert.equal(made.error, undefined);
  const sessionID = made.data.id;
  const res = await client.session.prompt({ sessionID, ...body("hi from 1.19") });
  assert.equal(res.error, undefined);
  assert.equal(textOf(res.data), "hi from 1.19");
  const status = await client.session.status();
  assert.equal(status.data[sessionID].type, "idle");
  const msgs = await client.session.messages({ sessionID });
  assert.equal(msgs.data.length, 2);
});

test("1.19: permissions once and always (remembered), over the global stream", async () => {
  const sessionID = (await client.session.create({})).data.id;
  const events = collect((await client.global.event()).stream);
  await events.until((e) => e.payload?.type === "server.connected");
  const asked = (n) => (e) => e.payload?.type === "permission.asked" && e.payload.properties.sessionID === sessionID
    && !n.includes(e.payload.properties.id);
  const idle = async (k) => {
    await events.until((e) => e.payload?.type === "session.idle" && e.payload.properties.sessionID === sessionID
      && events.seen.filter((x) => x.payload?.type === "session.idle" && x.payload.properties.sessionID === sessionID).length >= k);
  };

  await client.session.promptAsync({ sessionID, ...body("/permission") });
  const first = (await events.until(asked([]))).payload.properties;
  const listed = await client.permission.list();
  assert.ok(listed.data.some((p) => p.id === first.id));
  assert.equal((await client.permission.reply({ requestID: first.id, reply: "always" })).error, undefined);
  await idle(1);
  const replied = await events.until((e) => e.payload?.type === "permission.replied" && e.payload.properties.requestID === first.id);
  assert.equal(replied.payload.properties.reply, "always");

  const res = await client.session.prompt({ sessionID, ...body("/permission") });
  assert.equal(textOf(res.data), "permission: allow-always");
  const auto = await events.until((e) => e.payload?.type === "permission.replied"
    && e.payload.properties.requestID !== first.id);
  assert.equal(auto.payload.properties.reply, "always");
  assert.deepEqual((await client.permission.list()).data, []);
});

test("1.19: a question answered, and the model lock", async () => {
  const sessionID = (await client.session.create({})).data.id;
  const events = collect((await client.event.subscribe()).stream);
  await events.until((e) => e.type === "server.connected");
  await client.session.promptAsync({ sessionID, ...body("/question") });
  const asked = await events.until((e) => e.type === "question.asked" && e.properties.sessionID === sessionID);
  assert.equal(asked.properties.questions[0].question, "Proceed?");
  const r = await client.question.reply({ requestID: asked.properties.id, answers: [["No"]] });
  assert.equal(r.error, undefined);
  await events.until((e) => e.type === "session.idle" && e.properties.sessionID === sessionID);
  const msgs = await client.session.messages({ sessionID });
  assert.equal(textOf(msgs.data.at(-1)), 'answer: [["No"]]');
  const changed = await client.session.prompt({
    sessionID, model: { providerID: "mock", modelID: "mock-fast" }, parts: [{ type: "text", text: "x" }],
  });
  assert.ok(changed.error, "a model change after the first prompt is refused");
});

test("1.19: tokens and cost of the agent's usage updates, per message and per session", async () => {
  const sessionID = (await client.session.create({})).data.id;
  const first = (await client.session.prompt({ sessionID, ...body("/usage 900 100000 0.5") })).data;
  assert.equal(first.info.tokens.input, 900);
  assert.equal(first.info.cost, 0.5);
  const second = (await client.session.prompt({ sessionID, ...body("/usage 1000 100000 0.75") })).data;
  assert.equal(second.info.tokens.input, 1000);
  assert.equal(second.info.cost, 0.25);
  const got = (await client.session.get({ sessionID })).data;
  assert.equal(got.tokens.input, 1900);
  assert.equal(got.cost, 0.75);
  const msgs = (await client.session.messages({ sessionID })).data;
  const costs = msgs.filter((m) => m.info.role === "assistant").map((m) => m.info.cost);
  assert.deepEqual(costs, [0.5, 0.25]);
});
