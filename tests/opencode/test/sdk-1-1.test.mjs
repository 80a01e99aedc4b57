// The 1.1 line of @opencode-ai/sdk (the one the reference implementation was built against),
// its default (v1-style) client: path/body parameters.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createOpencodeClient } from "opencode-sdk-1-1";
import { startDaemon, collect, textOf } from "./daemon.mjs";

let d;
let client;
before(async () => {
  d = await startDaemon();
  client = createOpencodeClient({ baseUrl: d.url, headers: d.headers });
});
after(async () => { await d?.stop(); });

test("1.1: sessions are made, listed, renamed and deleted", async () => {
  const made = await client.session.create({ body: { title: "one-one" } });
  assert.equal(made.error, undefined);
  const id = made.data.id;
  const list = await client.session.list();
  assert.ok(list.data.some((s) => s.id === id));
  await client.session.update({ path: { id }, body: { title: "renamed" } });
  assert.equal((await client.session.get({ path: { id } })).data.title, "renamed");
  await client.session.delete({ path: { id } });
  const gone = await client.session.get({ path: { id } });
  assert.ok(gone.error, "a deleted session is not found");
});

test("1.1: a prompt turn answers the assistant message and streams its events", async () => {
  const id = (await client.session.create({ body: { title: "turn" } })).data.id;
  const events = collect((await client.event.subscribe()).stream);
  await events.until((e) => e.type === "server.connected");
  const res = await client.session.prompt({
    path: { id },
    body: { model: { providerID: "mock", modelID: "mock" }, parts: [{ type: "text", text: "hi from 1.1" }] },
  });
  assert.equal(res.error, undefined);
  assert.equal(res.data.info.role, "assistant");
  assert.equal(textOf(res.data), "hi from 1.1");
  await events.until((e) => e.type === "session.idle" && e.properties.sessionID === id);
  const mine = events.seen.filter((e) => e.properties?.sessionID === id || e.properties?.part?.sessionID === id);
  assert.equal(mine.filter((e) => e.type === "session.idle").length, 1);
  assert.ok(mine.some((e) => e.type === "message.part.updated" && e.properties.part.text === "hi from 1.1"));
  const msgs = await client.session.messages({ path: { id } });
  assert.deepEqual(msgs.data.map((m) => m.info.role), ["user", "assistant"]);
  const one = await client.session.message({ path: { id, messageID: msgs.data[1].info.id } });
  assert.equal(textOf(one.data), "hi from 1.1");
});

test("1.1: providers list every agent, the mock with its models", async () => {
  const res = await client.provider.list();
  const mock = res.data.all.find((p) => p.id === "mock");
  assert.ok(mock.models.mock && mock.models["mock-fast"]);
  assert.equal(res.data.default.mock, "mock");
  assert.ok(res.data.connected.includes("mock"));
  for (const agent of ["claude", "codex", "gemini", "opencode"]) {
    assert.ok(res.data.all.some((p) => p.id === agent), agent);
  }
  const paths = await client.path.get();
  assert.equal(typeof paths.data.directory, "string");
  const cfg = await client.config.get();
  assert.equal(cfg.error, undefined);
});

test("1.1: a permission answered through the session's route", async () => {
  const id = (await client.session.create({ body: {} })).data.id;
  const events = collect((await client.event.subscribe()).stream);
  await events.until((e) => e.type === "server.connected");
  await client.session.promptAsync({
    path: { id },
    body: { model: { providerID: "mock", modelID: "mock" }, parts: [{ type: "text", text: "/permission" }] },
  });
  const asked = await events.until((e) => e.type === "permission.updated" && e.properties.sessionID === id);
  const r = await client.postSessionIdPermissionsPermissionId({
    path: { id, permissionID: asked.properties.id },
    body: { response: "once" },
  });
  assert.equal(r.error, undefined);
  await events.until((e) => e.type === "session.idle" && e.properties.sessionID === id);
  const msgs = await client.session.messages({ path: { id } });
  assert.equal(textOf(msgs.data.at(-1)), "permission: allow-once");
});
