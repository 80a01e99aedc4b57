// Our image under the published `sandbox-agent` 0.4.2 SDK's own `docker` provider, unchanged (it
// talks to /var/run/docker.sock only: tests/it/providers.rs runs this file in a private mount
// namespace where that path is Podman's socket). Once with our SDK's SandboxAgent.start() and
// once with the published SDK's own. SANDBOX_AGENT_TEST_IMAGE names our image.
import { test } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { readFileSync } from "node:fs";
import Docker from "dockerode";
import { docker as publishedDocker } from "sandbox-agent/docker";
import { SandboxAgent as PublishedSandboxAgent } from "sandbox-agent";

const ours = await import(new URL("../../sdks/typescript/packages/sandbox-agent/dist/index.js", import.meta.url));
const image = process.env.SANDBOX_AGENT_TEST_IMAGE;
const SOCKET = "/var/run/docker.sock";
const engine = new Docker({ socketPath: SOCKET });

async function gone(id) {
  try {
    await engine.getContainer(id).inspect();
    return false;
  } catch (e) {
    return e.statusCode === 404;
  }
}

/** Runs the container's HEALTHCHECK now, through Podman's own API; resolves with its status. */
function healthcheck(id) {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: SOCKET, path: `/v4.0.0/libpod/containers/${id}/healthcheck`, method: "GET" }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

function texts(events) {
  return events.filter((e) => e.update?.sessionUpdate === "agent_message_chunk").map((e) => e.update.content.text);
}

test("the published docker provider, unchanged, under our SDK: session, permission, file, process, HEALTHCHECK, destroy", async () => {
  assert.ok(image, "SANDBOX_AGENT_TEST_IMAGE is set");
  const events = [];
  const asked = [];
  const sa = await ours.SandboxAgent.start({
    sandbox: publishedDocker({ image }),
    healthTimeoutMs: 60_000,
    onSessionUpdate: (e) => void events.push(e),
    onPermissionRequest: (req) => {
      asked.push(req);
      return req.options.find((o) => o.kind === "allow_once").optionId;
    },
  });
  const raw = sa.sandboxId.slice("docker/".length);
  try {
    // What the published provider gives our entrypoint, and that our binary runs with it.
    const info = await engine.getContainer(raw).inspect();
    assert.deepEqual(info.Config.Cmd, ["server", "--no-token", "--host", "0.0.0.0", "--port", "3000"]);
    const cmdline = readFileSync(`/proc/${info.State.Pid}/cmdline`, "utf8").split("\0").filter(Boolean);
    assert.deepEqual(cmdline, ["/usr/local/bin/sandbox-agent", ...info.Config.Cmd], "our daemon is PID 1 with that command line");
    // Our image's HEALTHCHECK follows the --port it was given (3000, not the image's 2468).
    const hc = await healthcheck(raw);
    assert.equal(hc.status, 200, hc.body);
    assert.match(hc.body, /"Status":"healthy"/, hc.body);

    const { sessionId } = await sa.newSession();
    assert.equal((await sa.prompt({ sessionId, prompt: "/stream 3" })).stopReason, "end_turn");
    assert.deepEqual(texts(events), ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]);
    assert.equal((await sa.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
    assert.equal(asked.length, 1);
    await sa.writeFile("p.txt", "published provider\n");
    assert.equal(new TextDecoder().decode(await sa.readFile("p.txt")), "published provider\n");
    const run = await sa.runProcess({ command: "sh", args: ["-c", "cat p.txt; id -u"] });
    assert.equal(run.stdout, "published provider\n10001\n");

    // The published provider has no pause(): pauseSandbox() falls back to destroy().
    assert.equal(publishedDocker({ image }).pause, undefined);
    await sa.pauseSandbox();
    assert.ok(await gone(raw), "the container is removed");
  } finally {
    await engine.getContainer(raw).remove({ force: true }).catch(() => {});
  }
});

test("the published SDK's own SandboxAgent.start with its docker provider drives our image", async () => {
  const sa = await PublishedSandboxAgent.start({ sandbox: publishedDocker({ image }) });
  const raw = sa.sandboxId.slice("docker/".length);
  try {
    // Its start() returns before the daemon answers; createSession() waits for health (getHealth()
    // would not), so it comes first.
    const session = await sa.createSession({ agent: "mock" });
    assert.equal((await sa.getHealth()).status, "ok");
    const events = [];
    session.onEvent((e) => void events.push(e));
    const asked = [];
    session.onPermissionRequest((req) => {
      asked.push(req);
      void session.respondPermission(req.id, "once");
    });
    assert.equal((await session.prompt([{ type: "text", text: "/stream 3" }])).stopReason, "end_turn");
    const chunks = events
      .map((e) => e.payload?.params?.update)
      .filter((u) => u?.sessionUpdate === "agent_message_chunk")
      .map((u) => u.content.text);
    assert.deepEqual(chunks, ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]);
    assert.equal((await session.prompt([{ type: "text", text: "/permission" }])).stopReason, "end_turn");
    assert.equal(asked.length, 1);
    await sa.writeFsFile({ path: "q.txt" }, new TextEncoder().encode("from the published SDK\n"));
    assert.equal(new TextDecoder().decode(await sa.readFsFile({ path: "q.txt" })), "from the published SDK\n");
    const run = await sa.runProcess({ command: "cat", args: ["q.txt"] });
    assert.equal(run.stdout, "from the published SDK\n");
    await sa.destroySandbox();
    assert.ok(await gone(raw), "the container is removed");
  } finally {
    // Its health wait has no deadline by default: dispose() ends it, or node would never exit.
    await sa.dispose().catch(() => {});
    await engine.getContainer(raw).remove({ force: true }).catch(() => {});
  }
});
