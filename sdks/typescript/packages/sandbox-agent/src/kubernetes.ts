/**
 * The `kubernetes` sandbox provider (Node only; import `sandbox-agent/kubernetes`, needs the
 * `@kubernetes/client-node` package): each sandbox is one Pod of the Sandbox Agent image plus a
 * Secret holding its token, reached through the API server's port-forward on a loopback port of
 * this process.
 *
 * Invariants: the token is generated per sandbox, stored only in the Secret and handed to the
 * daemon through `secretKeyRef` (never in the Pod spec or on a command line); the Secret is owned
 * by the Pod, so deleting the Pod deletes it too; every object carries the
 * `dev.sandbox-agent.sandbox=kubernetes` label, and `destroy`, `kill` and `reconnect` refuse a
 * Pod without it; the local forwarder listens on 127.0.0.1 only and is closed by `destroy`/`kill`
 * (and by `close()`); the wait for the Pod to leave `Pending` is bounded (`readyTimeoutMs`).
 */
import { createServer, type Server } from "node:net";
import type * as k8s from "@kubernetes/client-node";
import type { SandboxProvider } from "./sandbox.js";

/** The label every Pod and Secret of this provider carries (value `kubernetes`). */
export const SANDBOX_LABEL = "dev.sandbox-agent.sandbox";

export interface KubernetesProviderOptions {
  /** Namespace for the Pods and Secrets (default: the kubeconfig context's, else `default`). */
  namespace?: string;
  /** Image to run (default `sandbox-agent:latest`). */
  image?: string;
  /** `imagePullPolicy` of the container (default `IfNotPresent`). */
  imagePullPolicy?: "Always" | "IfNotPresent" | "Never";
  /**
   * A `KubeConfig` of `@kubernetes/client-node` (default: `loadFromDefault()`, i.e. `KUBECONFIG`,
   * `~/.kube/config` or the in-cluster service account).
   */
  kubeConfig?: object;
  /** The daemon's port in the Pod (default 2468). */
  port?: number;
  /** More environment for the daemon. */
  env?: Record<string, string>;
  /** More labels on the Pod and the Secret. */
  labels?: Record<string, string>;
  /** The container's `resources` (e.g. `{ limits: { memory: "2Gi", cpu: "1" } }`). */
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  /** How long `create()` waits for the Pod to leave `Pending` (default 120 s). */
  readyTimeoutMs?: number;
  /** Seconds the daemon gets after SIGTERM on `destroy` (default 15). */
  terminationGraceSeconds?: number;
  /** Working directory for sessions when none is given (default `/home/sandbox/workspace`). */
  defaultCwd?: string;
  /** More fields of the Pod's `spec`, merged last. */
  podSpec?: Record<string, unknown>;
}

type Client = { kc: k8s.KubeConfig; core: k8s.CoreV1Api; forward: k8s.PortForward; namespace: string };

/** A provider that runs each sandbox as a Pod of the Sandbox Agent image. */
export function kubernetes(
  options: KubernetesProviderOptions = {},
): SandboxProvider & { readonly namespace: Promise<string>; close(): Promise<void> } {
  const image = options.image ?? "sandbox-agent:latest";
  const port = options.port ?? 2468;
  const grace = options.terminationGraceSeconds ?? 15;
  const forwarders = new Map<string, Promise<{ server: Server; url: string }>>();
  let client: Promise<Client> | undefined;
  const api = (): Promise<Client> =>
    (client ??= (async () => {
      const lib = await loadClient();
      const kc = (options.kubeConfig as k8s.KubeConfig | undefined) ?? new lib.KubeConfig();
      if (!options.kubeConfig) kc.loadFromDefault();
      const namespace = options.namespace ?? kc.getContextObject(kc.getCurrentContext())?.namespace ?? "default";
      return { kc, core: kc.makeApiClient(lib.CoreV1Api), forward: new lib.PortForward(kc), namespace };
    })());

  async function ours(name: string): Promise<{ c: Client; pod: k8s.V1Pod }> {
    const c = await api();
    const pod = await c.core.readNamespacedPod({ name, namespace: c.namespace });
    if (pod.metadata?.labels?.[SANDBOX_LABEL] !== "kubernetes") {
      throw new Error(`pod ${name} is not a sandbox of the kubernetes provider (no ${SANDBOX_LABEL}=kubernetes label)`);
    }
    return { c, pod };
  }

  async function closeForwarder(name: string): Promise<void> {
    const f = forwarders.get(name);
    forwarders.delete(name);
    if (!f) return;
    const { server } = await f.catch(() => ({ server: null }));
    if (server) await new Promise<void>((r) => server.close(() => r()));
  }

  async function remove(name: string, gracePeriodSeconds: number): Promise<void> {
    await closeForwarder(name);
    const found = await ignoring404(() => ours(name));
    if (!found) return;
    const { c } = found;
    await ignoring404(() => c.core.deleteNamespacedPod({ name, namespace: c.namespace, gracePeriodSeconds }));
    // The Secret is owned by the Pod; deleting it here too does not wait for the garbage collector.
    await ignoring404(() => c.core.deleteNamespacedSecret({ name, namespace: c.namespace }));
  }

  return {
    name: "kubernetes",
    get namespace() {
      return api().then((c) => c.namespace);
    },
    defaultCwd: options.defaultCwd ?? "/home/sandbox/workspace",

    async create() {
      const c = await api();
      const name = `sandbox-agent-${randomHex(6)}`;
      const labels = { ...options.labels, [SANDBOX_LABEL]: "kubernetes" };
      const env = [
        ...Object.entries(options.env ?? {}).map(([k, v]) => ({ name: k, value: v })),
        { name: "SANDBOX_AGENT_HOST", value: "0.0.0.0" },
        { name: "SANDBOX_AGENT_PORT", value: String(port) },
        { name: "SANDBOX_AGENT_TOKEN", valueFrom: { secretKeyRef: { name, key: "token" } } },
      ];
      const pod = await c.core.createNamespacedPod({
        namespace: c.namespace,
        body: {
          apiVersion: "v1",
          kind: "Pod",
          metadata: { name, labels },
          spec: {
            restartPolicy: "Always",
            terminationGracePeriodSeconds: grace,
            containers: [
              {
                name: "sandbox-agent",
                image,
                imagePullPolicy: options.imagePullPolicy ?? "IfNotPresent",
                env,
                ports: [{ containerPort: port, name: "http" }],
                // GET / needs no token; the SDK's own wait checks /v1/health with the token.
                readinessProbe: { httpGet: { path: "/", port }, periodSeconds: 2 },
                ...(options.resources ? { resources: options.resources } : {}),
              },
            ],
            ...(options.podSpec ?? {}),
          },
        },
      });
      try {
        await c.core.createNamespacedSecret({
          namespace: c.namespace,
          body: {
            apiVersion: "v1",
            kind: "Secret",
            metadata: {
              name,
              labels,
              ownerReferences: [{ apiVersion: "v1", kind: "Pod", name, uid: pod.metadata!.uid!, blockOwnerDeletion: false }],
            },
            type: "Opaque",
            stringData: { token: randomHex(32) },
          },
        });
        await waitScheduled(c, name, options.readyTimeoutMs ?? 120_000);
      } catch (error) {
        await remove(name, 0).catch(() => {});
        throw error;
      }
      return name;
    },

    destroy: (name) => remove(name, grace),
    kill: (name) => remove(name, 0),

    async reconnect(name) {
      const { pod } = await ours(name);
      const phase = pod.status?.phase;
      if (phase !== "Running" && phase !== "Pending") {
        throw new Error(`pod ${name} is ${phase ?? "in an unknown phase"}; it cannot be reconnected`);
      }
    },

    async getUrl(name) {
      let f = forwarders.get(name);
      if (!f) {
        f = (async () => {
          const { c } = await ours(name);
          const server = createServer((socket) => {
            socket.on("error", () => socket.destroy());
            c.forward.portForward(c.namespace, name, [port], socket, null, socket).then(
              (ws) => {
                // The forwarder's WebSocket ends with the local connection.
                const close = () => (typeof ws === "function" ? ws()?.close() : ws.close());
                socket.once("close", close);
              },
              () => socket.destroy(),
            );
          });
          await new Promise<void>((resolve, reject) => {
            server.once("error", reject);
            server.listen(0, "127.0.0.1", () => resolve());
          });
          server.unref();
          const address = server.address();
          if (!address || typeof address === "string") throw new Error("port-forward listener has no port");
          return { server, url: `http://127.0.0.1:${address.port}` };
        })();
        forwarders.set(name, f);
        f.catch(() => forwarders.delete(name));
      }
      return (await f).url;
    },

    async getToken(name) {
      const c = await api();
      const secret = await c.core.readNamespacedSecret({ name, namespace: c.namespace });
      if (secret.metadata?.labels?.[SANDBOX_LABEL] !== "kubernetes") {
        throw new Error(`secret ${name} is not a sandbox's (no ${SANDBOX_LABEL}=kubernetes label)`);
      }
      const data = secret.data?.token;
      return data ? Buffer.from(data, "base64").toString("utf8") : undefined;
    },

    /** Closes every local port-forward listener of this provider (the Pods keep running). */
    async close() {
      await Promise.all([...forwarders.keys()].map(closeForwarder));
    },
  };
}

/** Waits until the Pod left `Pending` (scheduled, image there, container started) or failed. */
async function waitScheduled(c: Client, name: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "Pending";
  for (let delay = 200; ; delay = Math.min(delay * 2, 2_000)) {
    const pod = await c.core.readNamespacedPod({ name, namespace: c.namespace });
    const phase = pod.status?.phase ?? "Pending";
    const waiting = pod.status?.containerStatuses?.[0]?.state?.waiting;
    if (phase === "Running") return;
    if (phase === "Failed" || phase === "Succeeded") {
      throw new Error(`pod ${name} ended (${phase}): ${pod.status?.message ?? pod.status?.reason ?? "no reason given"}`);
    }
    // Reasons that do not resolve by waiting.
    if (waiting?.reason && /ErrImagePull|ImagePullBackOff|InvalidImageName|CreateContainerError/.test(waiting.reason)) {
      throw new Error(`pod ${name}: ${waiting.reason}: ${waiting.message ?? ""}`.trim());
    }
    last = waiting?.reason ? `${phase} (${waiting.reason})` : phase;
    if (Date.now() + delay > deadline) throw new Error(`pod ${name} still ${last} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, delay));
  }
}

async function ignoring404<T>(call: () => Promise<T>): Promise<T | undefined> {
  try {
    return await call();
  } catch (error) {
    if ((error as { code?: number }).code === 404) return undefined;
    throw error;
  }
}

function randomHex(bytes: number): string {
  const b = new Uint8Array(bytes);
  globalThis.crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

async function loadClient(): Promise<typeof k8s> {
  try {
    return await import("@kubernetes/client-node");
  } catch (error) {
    throw new Error("the kubernetes provider needs the `@kubernetes/client-node` package: npm install @kubernetes/client-node", {
      cause: error,
    });
  }
}
