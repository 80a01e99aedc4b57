// The `docker` provider against a real engine: Podman's Docker-compatible API on a private socket
// (SANDBOX_AGENT_TEST_DOCKER_SOCKET) running our image (SANDBOX_AGENT_TEST_IMAGE). Started by
// tests/it/providers.rs, which builds the image, starts `podman system service` and checks
// afterwards that nothing of these tests is left on the engine.
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, chmodSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SandboxAgent, SandboxStartError, SandboxDetachedError, HttpError } from "sandbox-agent";
import { docker, dockerEngine, SANDBOX_LABEL } from "sandbox-agent/docker";
import { chunkTexts, skipOrFail } from "../support.mjs";

const socketPath = process.env.SANDBOX_AGENT_TEST_DOCKER_SOCKET;
const image = process.env.SANDBOX_AGENT_TEST_IMAGE;
const engine = socketPath ? dockerEngine({ socketPath }) : null;
// Every container of this run carries this label, so the checks below see only this run's.
const RUN = `docker-test-${process.pid}`;
const TEST_LABEL = "dev.sandbox-agent.test-run";

function provider(extra = {}) {
  return docker({ image, socketPath, labels: { [TEST_LABEL]: RUN, ...extra.labels }, ...extra });
}

async function ourContainers() {
  return engine.listContainers({ all: true, filters: { label: [`${TEST_LABEL}=${RUN}`] } });
}

async function gone(id) {
  try {
    await engine.getContainer(id).inspect();
    return false;
  } catch (e) {
    return e.statusCode === 404;
  }
}

function need(t) {
  if (!socketPath || !image) {
    skipOrFail(t, "no engine: run through tests/it/providers.rs (SANDBOX_AGENT_TEST_DOCKER_SOCKET, _IMAGE)");
    return false;
  }
  return true;
}

before(async () => {
  if (engine) assert.deepEqual(await ourContainers(), [], "no container of this run before the tests");
});

test("start → streamed session, permission, file, process → pause → reconnect by id → dispose keeps it → destroy leaves nothing", async (t) => {
  if (!need(t)) return;
  const host = mkdtempSync(join(tmpdir(), "docker-provider-"));
  chmodSync(host, 0o755);
  writeFileSync(join(host, "from-host.txt"), "bound from the host\n");
  const events = [];
  const asked = [];
  const sa = await SandboxAgent.start({
    sandbox: provider({
      binds: [`${host}:/mnt/host:ro`],
      env: { SANDBOX_AGENT_LOG_FORMAT: "text", PROVIDER_TEST: "yes" },
      limits: { memoryBytes: 1024 * 1024 * 1024, pids: 4096, cpus: 1.5 },
    }),
    healthTimeoutMs: 60_000,
    onSessionUpdate: (e) => void events.push(e),
    onPermissionRequest: (req) => {
      asked.push(req);
      return req.options.find((o) => o.kind === "allow_once").optionId;
    },
  });
  const id = sa.sandboxId;
  try {
    assert.match(id, /^docker\/[0-9a-f]{64}$/);
    assert.equal(sa.connected, true, "start() returns a connected client");
    const raw = id.slice("docker/".length);
    const info = await engine.getContainer(raw).inspect();

    // The container: our labels, the limits, the port on loopback only, the token only in the env.
    assert.equal(info.Config.Labels[SANDBOX_LABEL], "docker");
    assert.equal(info.Config.Labels[TEST_LABEL], RUN);
    assert.equal(info.HostConfig.Memory, 1024 * 1024 * 1024);
    assert.equal(info.HostConfig.PidsLimit, 4096);
    assert.equal(info.HostConfig.NanoCpus, 1_500_000_000);
    const bindings = info.NetworkSettings.Ports["2468/tcp"];
    assert.ok(bindings.length > 0 && bindings.every((b) => b.HostIp === "127.0.0.1"), JSON.stringify(bindings));
    assert.equal(new URL(sa.baseUrl).hostname, "127.0.0.1");
    const tokenEntry = info.Config.Env.find((e) => e.startsWith("SANDBOX_AGENT_TOKEN="));
    const token = tokenEntry.slice("SANDBOX_AGENT_TOKEN=".length);
    assert.match(token, /^[0-9a-f]{64}$/, "a generated token");
    assert.ok(info.Config.Env.includes("PROVIDER_TEST=yes"));
    const cmdline = readFileSync(`/proc/${info.State.Pid}/cmdline`, "utf8").split("\0").filter(Boolean);
    assert.equal(cmdline[0], "/usr/local/bin/sandbox-agent", "the daemon is the container's PID 1");
    assert.ok(!cmdline.join(" ").includes(token) && ![...(info.Config.Cmd ?? []), ...(info.Args ?? [])].join(" ").includes(token),
      "the token is not on the command line");
    assert.equal((await fetch(`${sa.baseUrl}/v1/health`)).status, 401, "the daemon requires the token");

    // A mock session: streamed updates, then a permission round trip.
    const { sessionId } = await sa.newSession();
    assert.equal((await sa.prompt({ sessionId, prompt: "/stream 5" })).stopReason, "end_turn");
    assert.deepEqual(chunkTexts(events), [1, 2, 3, 4, 5].map((i) => `chunk ${i} of 5`));
    assert.equal((await sa.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
    assert.equal(asked.length, 1);
    const chosen = asked[0].options.find((o) => o.kind === "allow_once").optionId;
    assert.ok(chunkTexts(events).some((c) => c.includes(chosen)), `the agent saw ${chosen}`);

    // Files: written and read back inside the sandbox; the bind mount is there.
    await sa.writeFile("notes/a.txt", "written through the SDK\n");
    assert.equal(new TextDecoder().decode(await sa.readFile("notes/a.txt")), "written through the SDK\n");
    assert.equal(new TextDecoder().decode(await sa.readFile("/mnt/host/from-host.txt")), "bound from the host\n");
    await assert.rejects(sa.writeFile("/mnt/host/nope.txt", "x"), HttpError, "the bind is read-only");

    // A process in the sandbox, as the image's user, in its work dir.
    const run = await sa.runProcess({ command: "sh", args: ["-c", "id -u; pwd; cat notes/a.txt"] });
    assert.equal(run.exitCode, 0, run.stderr);
    assert.equal(run.stdout, "10001\n/home/sandbox/workspace\nwritten through the SDK\n");

    // Pause: the container stops but stays; the client is detached.
    await sa.pauseSandbox();
    assert.equal(sa.sandboxId, undefined);
    await assert.rejects(sa.destroySandbox(), SandboxDetachedError);
    const paused = await engine.getContainer(raw).inspect();
    assert.equal(paused.State.Running, false, "paused: not running");

    // Reconnect by id with a fresh provider (as another process would): the files are still there.
    const again = await SandboxAgent.start({ sandbox: provider(), sandboxId: id, healthTimeoutMs: 60_000 });
    assert.equal(again.sandboxId, id);
    assert.equal((await engine.getContainer(raw).inspect()).State.Running, true);
    assert.equal(new TextDecoder().decode(await again.readFile("notes/a.txt")), "written through the SDK\n");
    const s2 = await again.newSession();
    assert.equal((await again.prompt({ sessionId: s2.sessionId, prompt: "hello again" })).stopReason, "end_turn");
    // dispose() leaves the sandbox running.
    await again.dispose();
    assert.equal((await engine.getContainer(raw).inspect()).State.Running, true, "dispose() keeps the sandbox");

    // Destroy: nothing of it is left.
    const last = await SandboxAgent.start({ sandbox: provider(), sandboxId: id, healthTimeoutMs: 60_000 });
    await last.destroySandbox();
    assert.ok(await gone(raw), "the container is removed");
    assert.deepEqual(await ourContainers(), []);
  } finally {
    rmSync(host, { recursive: true, force: true });
    if (engine) await engine.getContainer(id.slice("docker/".length)).remove({ force: true }).catch(() => {});
  }
});

test("killSandbox removes the container at once", async (t) => {
  if (!need(t)) return;
  const sa = await SandboxAgent.start({ sandbox: provider(), healthTimeoutMs: 60_000, autoConnect: false });
  const raw = sa.sandboxId.slice("docker/".length);
  assert.equal((await sa.getHealth()).status, "ok");
  await sa.killSandbox();
  assert.ok(await gone(raw));
});

test("a bad image fails at step create with the engine's own error, and leaves nothing", async (t) => {
  if (!need(t)) return;
  const started = Date.now();
  const err = await SandboxAgent.start({
    sandbox: provider({ image: "localhost/sandbox-agent-no-such-image:0" }),
    healthTimeoutMs: 10_000,
  }).catch((e) => e);
  assert.ok(err instanceof SandboxStartError, String(err));
  assert.equal(err.step, "create");
  assert.equal(err.provider, "docker");
  assert.equal(err.cause.statusCode, 404, `the engine's error: ${err.cause}`);
  assert.match(err.message, /create failed/);
  assert.ok(Date.now() - started < 10_000, "failed within the configured time");
  assert.deepEqual(await ourContainers(), []);
});

test("a daemon that never becomes healthy fails at step health within healthTimeoutMs, after ensureServer, and is removed", async (t) => {
  if (!need(t)) return;
  const inner = provider({ createContainerOptions: { Entrypoint: ["/bin/sleep"], Cmd: ["infinity"] } });
  let ensured = 0;
  // A provider is a plain object: wrapping one (here to count ensureServer calls) keeps it working.
  const sandbox = { ...inner, ensureServer: async (id) => { ensured++; await inner.ensureServer(id); } };
  const timeout = 4_000;
  const started = Date.now();
  const err = await SandboxAgent.start({ sandbox, healthTimeoutMs: timeout, probeTimeoutMs: 1_000 }).catch((e) => e);
  const took = Date.now() - started;
  assert.ok(err instanceof SandboxStartError, String(err));
  assert.equal(err.step, "health");
  assert.match(err.sandboxId, /^docker\//);
  assert.ok(err.cause, "the last probe's error is the cause");
  // Creating the container comes before the health deadline starts; allow for it.
  assert.ok(took < timeout + 10_000, `gave up after ${took} ms`);
  assert.ok(ensured >= 1, "ensureServer was called after repeated failures");
  assert.ok(await gone(err.sandboxId.slice("docker/".length)), "the created container is removed again");
});

test("a wrong token fails at step auth (the daemon's 401), and the container is removed", async (t) => {
  if (!need(t)) return;
  const err = await SandboxAgent.start({ sandbox: provider(), token: "not-the-token", healthTimeoutMs: 60_000 }).catch((e) => e);
  assert.ok(err instanceof SandboxStartError, String(err));
  assert.equal(err.step, "auth");
  assert.match(err.cause.message, /401/);
  assert.ok(await gone(err.sandboxId.slice("docker/".length)));
});

test("reconnect to an unknown id fails at step start; destroy refuses a container that is not ours", async (t) => {
  if (!need(t)) return;
  const err = await SandboxAgent.start({ sandbox: provider(), sandboxId: "docker/0123456789abcdef" }).catch((e) => e);
  assert.ok(err instanceof SandboxStartError, String(err));
  assert.equal(err.step, "start");
  assert.equal(err.cause.statusCode, 404);

  const foreign = await engine.createContainer({ Image: image, Labels: { [TEST_LABEL]: RUN } });
  try {
    await assert.rejects(provider().destroy(foreign.id), /not a sandbox of the docker provider/);
    assert.equal(await gone(foreign.id), false, "the foreign container is untouched");
  } finally {
    await foreign.remove({ force: true });
  }
  assert.throws(() => docker({ host: "0.0.0.0" }), TypeError, "a non-loopback host is refused");
});

test("the worked example of docs/sdk-typescript.md runs as written", async (t) => {
  if (!need(t)) return;
  const doc = readFileSync(new URL("../../../../docs/sdk-typescript.md", import.meta.url), "utf8");
  const m = /<!-- providers-example -->\s*```js\n([\s\S]*?)```/.exec(doc);
  assert.ok(m, "the example block is marked in the docs");
  // The example reads DOCKER_SOCKET and IMAGE; it runs as a module next to this file.
  const dir = mkdtempSync(join(new URL(".", import.meta.url).pathname, ".example-"));
  try {
    writeFileSync(join(dir, "example.mjs"), m[1]);
    const out = execFileSync(process.execPath, [join(dir, "example.mjs")], {
      env: { ...process.env, DOCKER_SOCKET: socketPath, IMAGE: image },
      encoding: "utf8",
      timeout: 120_000,
    });
    assert.match(out, /answered: end_turn/);
    assert.match(out, /destroyed docker\/[0-9a-f]{64}/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const left = await engine.listContainers({ all: true, filters: { label: [`${SANDBOX_LABEL}=docker`] } });
  assert.deepEqual(left.filter((c) => c.Image === image && !c.Labels[TEST_LABEL]), [], "the example left nothing");
});
