/**
 * The `docker` sandbox provider (Node only; import `sandbox-agent/docker`): each sandbox is one
 * container of the Sandbox Agent image, the daemon its PID 1, on a Docker engine or on Podman's
 * Docker-compatible API (`podman system service`). It talks to the engine's API itself, over its
 * Unix socket with `node:http` (`dockerEngine`), so no engine client package is needed — in
 * particular none of `dockerode`'s native modules (`ssh2`, `cpu-features`) with their install
 * scripts. A `dockerode` client (or any object of the same shape) can still be passed as `docker`,
 * e.g. for an engine over TLS or SSH.
 *
 * Invariants: the token is generated per sandbox and reaches the daemon only through the
 * container's environment (never its command line); the daemon's port is published on a loopback
 * address only (another host address is refused); every container carries the
 * `dev.sandbox-agent.sandbox=docker` label, and `destroy`, `pause`, `kill` and `reconnect` refuse
 * a container without it; a container whose start fails is removed before the error is thrown.
 */
import { request } from "node:http";
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
  /** An engine client of your own, e.g. a `dockerode` client (default: `dockerEngine({ socketPath })`). */
  docker?: DockerLike;
  /**
   * The engine's socket; default: `DOCKER_HOST` when it is a `unix://` address, else
   * `/var/run/docker.sock`. For Podman: the socket `podman system service` listens on.
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
      : Promise.resolve(dockerEngine({ socketPath: options.socketPath })));

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

/** An error answer of the engine's API; `statusCode` is the HTTP status (as `dockerode`'s errors). */
export class DockerEngineError extends Error {
  constructor(
    message: string,
    readonly statusCode: number,
    readonly json?: unknown,
  ) {
    super(message);
    this.name = "DockerEngineError";
  }
}

/** A container of `dockerEngine`, by id. */
export interface DockerEngineContainer extends DockerContainerLike {}

/** The Docker Engine API client the provider uses by default. */
export interface DockerEngine extends DockerLike {
  getContainer(id: string): DockerEngineContainer;
  /** `GET /containers/json` (`all`, `filters` as the engine takes them). */
  listContainers(options?: { all?: boolean; filters?: Record<string, string[]> }): Promise<any[]>;
}

/**
 * A minimal client of the Docker Engine API (Docker, or Podman's compatible API) over its Unix
 * socket, with `node:http`: the calls the provider makes and `listContainers`. The socket:
 * `socketPath`, else `DOCKER_HOST` when it is `unix://…`, else `/var/run/docker.sock`. Other
 * `DOCKER_HOST` schemes (tcp with TLS, ssh) are refused with a message: pass a `dockerode` client
 * as the provider's `docker` option for those.
 */
export function dockerEngine(options: { socketPath?: string } = {}): DockerEngine {
  let socketPath = options.socketPath;
  if (!socketPath) {
    const env = globalThis.process?.env?.DOCKER_HOST;
    if (env && !env.startsWith("unix://")) {
      throw new Error(
        `DOCKER_HOST=${env}: the built-in engine client speaks only to a Unix socket; pass a dockerode client as \`docker\``,
      );
    }
    socketPath = env ? env.slice("unix://".length) : "/var/run/docker.sock";
  }
  const path = socketPath;

  async function call(method: string, url: string, body?: unknown, okEmpty = false): Promise<any> {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    return await new Promise((resolve, reject) => {
      const req = request(
        {
          socketPath: path,
          method,
          path: url,
          headers: payload
            ? { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(payload) }
            : {},
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("error", reject);
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8");
            let json: any;
            try {
              json = text ? JSON.parse(text) : undefined;
            } catch {
              json = undefined;
            }
            const status = res.statusCode ?? 0;
            if (status >= 200 && status < 300) return resolve(okEmpty ? undefined : json);
            const reason = (json && typeof json.message === "string" && json.message) || text.trim() || res.statusMessage;
            reject(new DockerEngineError(`(HTTP code ${status}) ${method} ${url}: ${reason}`, status, json));
          });
        },
      );
      req.on("error", reject);
      if (payload) req.write(payload);
      req.end();
    });
  }

  const query = (params: Record<string, unknown> | undefined): string => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params ?? {})) {
      if (v !== undefined) q.set(k, typeof v === "object" ? JSON.stringify(v) : String(v));
    }
    const s = q.toString();
    return s ? `?${s}` : "";
  };

  const container = (id: string): DockerEngineContainer => {
    const base = `/containers/${encodeURIComponent(id)}`;
    return {
      id,
      start: (o) => call("POST", `${base}/start${query(o)}`, undefined, true),
      stop: (o) => call("POST", `${base}/stop${query(o)}`, undefined, true),
      remove: (o) => call("DELETE", `${base}${query(o)}`, undefined, true),
      kill: (o) => call("POST", `${base}/kill${query(o)}`, undefined, true),
      unpause: (o) => call("POST", `${base}/unpause${query(o)}`, undefined, true),
      inspect: (o) => call("GET", `${base}/json${query(o)}`),
    };
  };

  return {
    async createContainer(opts) {
      const { name, ...body } = opts as { name?: string } & Record<string, unknown>;
      const made = await call("POST", `/containers/create${query({ name })}`, body);
      return container(made.Id);
    },
    getContainer: container,
    listContainers: (o) => call("GET", `/containers/json${query(o)}`),
  };
}
