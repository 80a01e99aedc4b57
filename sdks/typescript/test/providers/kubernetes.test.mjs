// The `kubernetes` provider against a real cluster: runs only when KUBECONFIG names one (started by
// tests/it/providers.rs, which is ignored — reported as not run — without it). The image
// (SANDBOX_AGENT_TEST_K8S_IMAGE, default `sandbox-agent:latest`) must be pullable by the cluster's
// nodes; the namespace is SANDBOX_AGENT_TEST_K8S_NAMESPACE or the context's.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as k8s from "@kubernetes/client-node";
import { SandboxAgent, SandboxStartError } from "sandbox-agent";
import { kubernetes, SANDBOX_LABEL } from "sandbox-agent/kubernetes";
import { chunkTexts, eventually } from "../support.mjs";

const image = process.env.SANDBOX_AGENT_TEST_K8S_IMAGE ?? "sandbox-agent:latest";
const namespace = process.env.SANDBOX_AGENT_TEST_K8S_NAMESPACE;

function need(t) {
  if (!process.env.KUBECONFIG) {
    // Never counted as passed: the Rust driver does not run this file without KUBECONFIG.
    throw new Error("NOT RUN: no KUBECONFIG (run through tests/it/providers.rs with a cluster)");
  }
  return true;
}

async function absent(core, ns, name) {
  const pod = await core.readNamespacedPod({ name, namespace: ns }).catch((e) => (e.code === 404 ? null : Promise.reject(e)));
  const secret = await core.readNamespacedSecret({ name, namespace: ns }).catch((e) => (e.code === 404 ? null : Promise.reject(e)));
  return !pod && !secret;
}

test("start → streamed session, permission, file, process → dispose keeps it → reconnect → destroy removes Pod and Secret", async (t) => {
  need(t);
  const provider = kubernetes({ image, namespace });
  const events = [];
  const asked = [];
  const sa = await SandboxAgent.start({
    sandbox: provider,
    healthTimeoutMs: 180_000,
    onSessionUpdate: (e) => void events.push(e),
    onPermissionRequest: (req) => {
      asked.push(req);
      return req.options.find((o) => o.kind === "allow_once").optionId;
    },
  });
  const kc = new k8s.KubeConfig();
  kc.loadFromDefault();
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const ns = await provider.namespace;
  const name = sa.sandboxId.slice("kubernetes/".length);
  try {
    const pod = await core.readNamespacedPod({ name, namespace: ns });
    assert.equal(pod.metadata.labels[SANDBOX_LABEL], "kubernetes");
    const env = pod.spec.containers[0].env;
    assert.ok(!JSON.stringify(pod.spec).includes(await provider.getToken(name)), "the token is not in the Pod spec");
    assert.equal(env.find((e) => e.name === "SANDBOX_AGENT_TOKEN").valueFrom.secretKeyRef.name, name);
    assert.equal((await fetch(`${sa.baseUrl}/v1/health`)).status, 401);

    const { sessionId } = await sa.newSession();
    assert.equal((await sa.prompt({ sessionId, prompt: "/stream 5" })).stopReason, "end_turn");
    assert.deepEqual(chunkTexts(events), [1, 2, 3, 4, 5].map((i) => `chunk ${i} of 5`));
    assert.equal((await sa.prompt({ sessionId, prompt: "/permission" })).stopReason, "end_turn");
    assert.equal(asked.length, 1);
    await sa.writeFile("notes/k.txt", "in a pod\n");
    assert.equal(new TextDecoder().decode(await sa.readFile("notes/k.txt")), "in a pod\n");
    const run = await sa.runProcess({ command: "sh", args: ["-c", "cat notes/k.txt"] });
    assert.equal(run.stdout, "in a pod\n");

    const id = sa.sandboxId;
    await sa.dispose();
    const again = await SandboxAgent.start({ sandbox: kubernetes({ image, namespace }), sandboxId: id, healthTimeoutMs: 60_000 });
    assert.equal(new TextDecoder().decode(await again.readFile("notes/k.txt")), "in a pod\n");
    await again.destroySandbox();
    await eventually(() => absent(core, ns, name), { timeoutMs: 60_000, what: "Pod and Secret deleted" });
  } finally {
    await provider.kill(name).catch(() => {});
    await provider.close();
  }
});

test("a bad image fails at step create; a wrong token at step auth; nothing is left", async (t) => {
  need(t);
  const kc = new k8s.KubeConfig();
  kc.loadFromDefault();
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const bad = kubernetes({ image: "localhost:1/sandbox-agent-no-such-image:0", namespace, readyTimeoutMs: 60_000 });
  const err = await SandboxAgent.start({ sandbox: bad }).catch((e) => e);
  assert.ok(err instanceof SandboxStartError, String(err));
  assert.equal(err.step, "create");
  const provider = kubernetes({ image, namespace });
  const auth = await SandboxAgent.start({ sandbox: provider, token: "wrong", healthTimeoutMs: 180_000 }).catch((e) => e);
  assert.ok(auth instanceof SandboxStartError, String(auth));
  assert.equal(auth.step, "auth");
  const ns = await provider.namespace;
  await eventually(() => absent(core, ns, auth.sandboxId.slice("kubernetes/".length)), { timeoutMs: 60_000, what: "removed" });
  await provider.close();
  await bad.close();
});
