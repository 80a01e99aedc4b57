/**
 * The `docker` sandbox provider (Node only; import `sandbox-agent/docker`, needs the `dockerode`
 * package): each sandbox is one container of the Sandbox Agent image, the daemon its PID 1, on a
 * Docker engine or on Podman's Docker-compatible API (`podman system service`).
 *
 * Invariants: the token is generated per sandbox and reaches the daemon only through the
 * container's environment (never its command line); the daemon's port is published on a loopback
 * address only (another host address is refused); every container carries the
 * `dev.sandbox-agent.sandbox=docker` label, and `destroy`, `pause`, `kill` and `reconnect` refuse
 * a container without it; a container whose start fails is removed before the error is thrown.
 */
import type { SandboxProvider } from "./sandbox.js";

/** The label every container of this provider carries (value `docker`). */
export const SANDBOX_LABEL = "dev.sandbox-agent.sandbox";
/** The label that records the daemon's port inside the container. */
export const PORT_LABEL = "dev.sandbox-agent.port";

/** The parts of a `dockerode` container this provider uses. */
export interface DockerContainerLike {
  id: string;
  start(options?: Record<string, unknown>): Promise<unknown>;
  stop(options?: Record<string, unknown>): Promise<unknown>;
  remove(options?: Record<string, unknown>): Promise<unknown>;
  kill(options?: Record<string, unknown>): Promise<unknown>;
  unpause(options?: Record<string, unknown>): Promise<unknown>;
  inspect(options?: Record<string, unknown>): Promise<any>;
}

/** The parts of a `dockerode` client this provider uses. */
export interface DockerLike {
  createContainer(options: Record<string, unknown>): Promise<DockerContainerLike>;
  getContainer(id: string): DockerContainerLike;
}

export interface DockerProviderOptions {
  /** Image to run (default `sandbox-agent:latest`, built from the repository's docker/Dockerfile). */
  image?: string;
  /** A `dockerode` client of your own (default: a new one for `socketPath`). */
  docker?: DockerLike;
  /**
   * The engine's socket; default: what `dockerode` picks (`DOCKER_HOST`, else
   * `/var/run/docker.sock`). For Podman: the socket `podman system service` listens on.
   */
  socketPath?: string;
  /** Loopback address the daemon's port is published on (default `127.0.0.1`; `::1` also works). */
  host?: string;
  /** The daemon's port inside the container (default 2468). */
  port?: number;
  /** More environment for the daemon (e.g. `SANDBOX_AGENT_LOG_FORMAT`, agent API keys). */
  env?: Record<string, string>;
  /** Bind mounts, as the engine takes them: `"/host/dir:/home/sandbox/workspace:rw"`. */
  binds?: string[];
  /** More labels on the container. */
  labels?: Record<string, string>;
  /** Resource limits of the container. */
  limits?: {
    /** Memory limit in bytes. */
    memoryBytes?: number;
    /** CPUs (e.g. 1.5). */
    cpus?: number;
    /** Most processes and threads at once. */
    pids?: number;
  };
  /** Process limits (`nofile`, `nproc`, …) of the container. */
  ulimits?: { name: string; soft: number; hard: number }[];
  /** Network mode (default: the engine's default network). */
  network?: string;
  /** Seconds `destroy`/`pause` give the daemon after SIGTERM before SIGKILL (default 15). */
  stopTimeoutSeconds?: number;
  /** Working directory for sessions when none is given (default `/home/sandbox/workspace`). */
  defaultCwd?: string;
  /** More create options for the engine, merged last (`HostConfig` key by key). */
  createContainerOptions?: Record<string, unknown>;
}

const LOOPBACK = /^(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|::1|localhost)$/;

/** A provider that runs each sandbox as a container of the Sandbox Agent image. */
export function docker(options: DockerProviderOptions = {}): SandboxProvider & { readonly image: string } {
  const image = options.image ?? "sandbox-agent:latest";
  const host = options.host ?? "127.0.0.1";
  if (!LOOPBACK.test(host)) {
    throw new TypeError(`docker provider: host must be a loopback address, got "${host}"`);
  }
  const port = options.port ?? 2468;
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new TypeError(`docker provider: port must be 1-65535, got ${port}`);
  }
  const stopSeconds = options.stopTimeoutSeconds ?? 15;
  let client: Promise<DockerLike> | undefined;
  const engine = (): Promise<DockerLike> =>
    (client ??= options.docker
      ? Promise.resolve(options.docker)
      : loadDockerode().then((Docker) => new Docker(options.socketPath ? { socketPath: options.socketPath } : undefined)));

  /** Inspects a container and checks it is one of ours. */
  async function ours(id: string): Promise<{ container: DockerContainerLike; info: any }> {
    const container = (await engine()).getContainer(id);
    const info = await container.inspect();
    if (info?.Config?.Labels?.[SANDBOX_LABEL] !== "docker") {
      throw new Error(`container ${id} is not a sandbox of the docker provider (no ${SANDBOX_LABEL}=docker label)`);
    }
    return { container, info };
  }

  /** Starts (or unpauses) the container unless it runs. */
  async function running(id: string): Promise<void> {
    const { container, info } = await ours(id);
    if (info.State?.Paused) await container.unpause();
    else if (!info.State?.Running) await ignoring([304], () => container.start());
  }

  return {
    name: "docker",
    image,
    defaultCwd: options.defaultCwd ?? "/home/sandbox/workspace",

    async create() {
      const docker = await engine();
      const token = randomToken();
      const env = {
        ...options.env,
        SANDBOX_AGENT_HOST: "0.0.0.0",
        SANDBOX_AGENT_PORT: String(port),
        SANDBOX_AGENT_TOKEN: token,
      };
      const limits = options.limits ?? {};
      const hostConfig: Record<string, unknown> = {
        PortBindings: { [`${port}/tcp`]: [{ HostIp: host, HostPort: "" }] },
        Binds: options.binds ?? [],
        ...(options.network ? { NetworkMode: options.network } : {}),
        ...(limits.memoryBytes ? { Memory: limits.memoryBytes } : {}),
        ...(limits.cpus ? { NanoCpus: Math.round(limits.cpus * 1e9) } : {}),
        ...(limits.pids ? { PidsLimit: limits.pids } : {}),
        ...(options.ulimits ? { Ulimits: options.ulimits.map((u) => ({ Name: u.name, Soft: u.soft, Hard: u.hard })) } : {}),
      };
      const extra = options.createContainerOptions ?? {};
      const container = await docker.createContainer({
        Image: image,
        Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
        ExposedPorts: { [`${port}/tcp`]: {} },
        Labels: { ...options.labels, [SANDBOX_LABEL]: "docker", [PORT_LABEL]: String(port) },
        StopTimeout: stopSeconds,
        ...extra,
        HostConfig: { ...hostConfig, ...((extra.HostConfig as Record<string, unknown> | undefined) ?? {}) },
      });
      try {
        await container.start();
      } catch (error) {
        await container.remove({ force: true, v: true }).catch(() => {});
        throw error;
      }
      return container.id;
    },

    async destroy(id) {
      const found = await ignoring([404], () => ours(id));
      if (!found) return;
      await ignoring([304, 404, 409], () => found.container.stop({ t: stopSeconds }));
      await ignoring([404, 409], () => found.container.remove({ force: true, v: true }));
    },

    async kill(id) {
      const found = await ignoring([404], () => ours(id));
      if (!found) return;
      // SIGKILL first: Podman's forced removal would give the container its stop timeout.
      // (Killing a container that is not running fails; the removal below still reports errors.)
      await found.container.kill({ signal: "SIGKILL" }).catch(() => {});
      await ignoring([404, 409], () => found.container.remove({ force: true, v: true }));
    },

    async pause(id) {
      const { container } = await ours(id);
      await ignoring([304], () => container.stop({ t: stopSeconds }));
    },

    reconnect: running,
    ensureServer: running,

    async getUrl(id) {
      const { info } = await ours(id);
      const inner = info.Config?.Labels?.[PORT_LABEL] ?? String(port);
      const bindings: { HostIp?: string; HostPort?: string }[] = info.NetworkSettings?.Ports?.[`${inner}/tcp`] ?? [];
      const binding = bindings.find((b) => b.HostPort && LOOPBACK.test(b.HostIp || "")) ?? bindings.find((b) => b.HostPort);
      if (!binding?.HostPort) {
        const state = info.State?.Running ? "running" : `not running (${info.State?.Status ?? "unknown"})`;
        throw new Error(`container ${id} publishes no host port for ${inner}/tcp; it is ${state}`);
      }
      const ip = binding.HostIp && binding.HostIp !== "0.0.0.0" && binding.HostIp !== "::" ? binding.HostIp : host;
      return `http://${ip.includes(":") ? `[${ip}]` : ip}:${binding.HostPort}`;
    },

    async getToken(id) {
      const { info } = await ours(id);
      const entry = (info.Config?.Env as string[] | undefined)?.find((e) => e.startsWith("SANDBOX_AGENT_TOKEN="));
      return entry?.slice("SANDBOX_AGENT_TOKEN=".length);
    },
  };
}

/** 32 random bytes as hex. */
function randomToken(): string {
  const bytes = new Uint8Array(32);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Runs `call`; an engine error with one of `codes` (already done, gone) resolves to undefined. */
async function ignoring<T>(codes: number[], call: () => Promise<T>): Promise<T | undefined> {
  try {
    return await call();
  } catch (error) {
    if (codes.includes((error as { statusCode?: number }).statusCode ?? 0)) return undefined;
    throw error;
  }
}

type DockerodeConstructor = new (options?: { socketPath?: string }) => DockerLike;

async function loadDockerode(): Promise<DockerodeConstructor> {
  const name = "dockerode";
  try {
    const mod = (await import(name)) as { default: DockerodeConstructor };
    return mod.default;
  } catch (error) {
    throw new Error("the docker provider needs the `dockerode` package: npm install dockerode", { cause: error });
  }
}
