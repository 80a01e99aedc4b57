/**
 * Sandboxes from a provider: `SandboxAgent.start({ sandbox: provider })` makes (or, with
 * `sandboxId`, finds again) a sandbox that runs the daemon, waits until the daemon answers, and
 * returns a client connected to it. The provider interface has the names and meaning of the
 * published `sandbox-agent` 0.4.2 SDK's, so a provider written for that SDK works here unchanged.
 *
 * Invariants: every wait is bounded (`healthTimeoutMs`, each probe `probeTimeoutMs`); a failure
 * is a {@link SandboxStartError} naming the step (create, start, health, auth, connect) and
 * carrying the provider's (or the daemon's) own error as `cause`; a sandbox this call created is
 * removed again when the start fails (`kill`, else `destroy`; one it only reconnected to is left
 * as it was).
 * Browser-safe: nothing here needs Node.
 */
import { SandboxAgentClient, type SandboxAgentClientOptions } from "./client.js";

/** A place that can run the daemon: a container engine, a cluster, a hosted sandbox service. */
export interface SandboxProvider {
  /** Provider name; sandbox ids are `name/rawId` (e.g. `docker/3f2a…`). */
  name: string;
  /** Makes a new sandbox running the daemon; resolves with the provider's own id for it. */
  create(): Promise<string>;
  /** Removes the sandbox for good (and everything the provider made for it). */
  destroy(sandboxId: string): Promise<void>;
  /** Called before the health checks when attaching to an existing sandbox (e.g. resume it). */
  reconnect?(sandboxId: string): Promise<void>;
  /** Stops or pauses the sandbox without deleting it; without it, callers fall back to `destroy`. */
  pause?(sandboxId: string): Promise<void>;
  /** Deletes the sandbox at once; without it, callers fall back to `destroy`. */
  kill?(sandboxId: string): Promise<void>;
  /** The daemon's base URL for this sandbox (or implement `getFetch`). */
  getUrl?(sandboxId: string): Promise<string>;
  /** A `fetch` that reaches the daemon in this sandbox (for providers without a URL). */
  getFetch?(sandboxId: string): Promise<typeof globalThis.fetch>;
  /**
   * Makes sure the daemon runs in the sandbox. Called after repeated failed health checks and
   * when reconnecting; must be idempotent.
   */
  ensureServer?(sandboxId: string): Promise<void>;
  /** Working directory for sessions inside the sandbox when the caller names none. */
  defaultCwd?: string;
  /** The token the daemon in this sandbox requires (used when `start()` is given none). */
  getToken?(sandboxId: string): Promise<string | undefined>;
}

/** Which step of `SandboxAgent.start()` failed. */
export type SandboxStep =
  /** `provider.create()` threw (bad image, quota, engine unreachable, …). */
  | "create"
  /** Making the sandbox reachable threw: `reconnect`, `ensureServer`, `getUrl`/`getFetch`, `getToken`. */
  | "start"
  /** The daemon never answered `/v1/health` within `healthTimeoutMs`. */
  | "health"
  /** The daemon answered but refused the token (401/403). */
  | "auth"
  /** The daemon is healthy but starting or initializing the agent failed. */
  | "connect";

/** `SandboxAgent.start()` failed at `step`; `cause` is the provider's or the daemon's own error. */
export class SandboxStartError extends Error {
  readonly step: SandboxStep;
  readonly provider: string;
  /** The prefixed id (`name/rawId`) when the sandbox got one before the failure. */
  readonly sandboxId?: string;
  constructor(step: SandboxStep, provider: string, sandboxId: string | undefined, cause: unknown, detail?: string) {
    const why = detail ?? (cause instanceof Error ? cause.message : String(cause));
    super(`sandbox provider "${provider}": ${step} failed${sandboxId ? ` (${sandboxId})` : ""}: ${why}`, { cause });
    this.name = "SandboxStartError";
    this.step = step;
    this.provider = provider;
    this.sandboxId = sandboxId;
  }
}

/** A call that needs a sandbox on a client that has none (never started one, or already ended it). */
export class SandboxDetachedError extends Error {
  constructor(message = "this client is not attached to a sandbox") {
    super(message);
    this.name = "SandboxDetachedError";
  }
}

export interface SandboxStartOptions extends Omit<SandboxAgentClientOptions, "baseUrl" | "token" | "agent" | "fetch"> {
  /** Where to run the daemon. */
  sandbox: SandboxProvider;
  /** `name/rawId` of an existing sandbox to attach to instead of creating one. */
  sandboxId?: string;
  /** Token for the daemon; default: the provider's `getToken()`, else none. */
  token?: string;
  /** Agent for the returned client (default `mock`). */
  agent?: string;
  /** A `fetch` of your own; default: the provider's `getFetch()`, else the global one. */
  fetch?: typeof globalThis.fetch;
  /** How long to wait for `/v1/health` in all (default 120 s). */
  healthTimeoutMs?: number;
  /** Bound on each health probe (default 5 s). */
  probeTimeoutMs?: number;
  /** Consecutive failed probes before `ensureServer()` is called (default 3). */
  ensureServerAfter?: number;
  /** Do not wait for health (and do not connect the agent). */
  skipHealthCheck?: boolean;
  /** Aborts the start; the error is then the abort reason. */
  signal?: AbortSignal;
}

const FIRST_DELAY_MS = 200;
const MAX_DELAY_MS = 5_000;

/**
 * A client of the daemon in a sandbox made by a provider. `dispose()` only disconnects (the
 * sandbox keeps running; attach again with its `sandboxId`); `destroySandbox()`, `pauseSandbox()`
 * and `killSandbox()` end it through the provider.
 */
export class SandboxAgent extends SandboxAgentClient {
  private provider: SandboxProvider | undefined;
  private rawId: string | undefined;

  /** Makes (or attaches to) a sandbox, waits for its daemon and returns a connected client. */
  static async start(options: SandboxStartOptions): Promise<SandboxAgent> {
    const provider = options.sandbox;
    if (!provider || typeof provider.create !== "function" || typeof provider.destroy !== "function") {
      throw new TypeError("sandbox must be a provider with create() and destroy()");
    }
    if (!provider.getUrl && !provider.getFetch) {
      throw new TypeError(`sandbox provider "${provider.name}" has neither getUrl() nor getFetch()`);
    }
    let rawId: string;
    let created = false;
    if (options.sandboxId !== undefined) {
      const slash = options.sandboxId.indexOf("/");
      if (slash < 1 || slash === options.sandboxId.length - 1) {
        throw new TypeError(`sandboxId must be "provider/id", got "${options.sandboxId}"`);
      }
      if (options.sandboxId.slice(0, slash) !== provider.name) {
        throw new TypeError(`sandboxId "${options.sandboxId}" is not of provider "${provider.name}"`);
      }
      rawId = options.sandboxId.slice(slash + 1);
    } else {
      options.signal?.throwIfAborted();
      try {
        rawId = await provider.create();
      } catch (error) {
        throw new SandboxStartError("create", provider.name, undefined, error);
      }
      created = true;
    }
    const id = `${provider.name}/${rawId}`;
    try {
      let token = options.token;
      try {
        if (!created) {
          await provider.reconnect?.(rawId);
          await provider.ensureServer?.(rawId);
        }
        if (token === undefined && provider.getToken) token = await provider.getToken(rawId);
      } catch (error) {
        throw new SandboxStartError("start", provider.name, id, error);
      }
      const reach = async (): Promise<Endpoint> => {
        try {
          return await endpoint(provider, rawId, options.fetch);
        } catch (error) {
          throw new SandboxStartError("start", provider.name, id, error);
        }
      };
      let where = await reach();
      if (!options.skipHealthCheck) where = await waitForHealth(options, provider, rawId, id, where, token, reach);
      const agent = new SandboxAgent({
        ...options,
        baseUrl: where.baseUrl,
        token,
        fetch: where.fetch,
        agent: options.agent ?? "mock",
        autoConnect: false,
      });
      agent.provider = provider;
      agent.rawId = rawId;
      if (!options.skipHealthCheck && (options.autoConnect ?? true)) {
        try {
          await agent.connect();
        } catch (error) {
          await agent.disconnect().catch(() => {});
          throw new SandboxStartError("connect", provider.name, id, error);
        }
      }
      return agent;
    } catch (error) {
      // The sandbox never served anyone: remove it at once (`kill`), else through `destroy`.
      if (created) await (provider.kill ? provider.kill(rawId) : provider.destroy(rawId)).catch(() => {});
      throw error;
    }
  }

  /** `name/rawId` of the sandbox (give it to `start({ sandboxId })` to attach again). */
  get sandboxId(): string | undefined {
    return this.provider && this.rawId !== undefined ? `${this.provider.name}/${this.rawId}` : undefined;
  }

  /** The provider of the sandbox, while attached. */
  get sandbox(): SandboxProvider | undefined {
    return this.provider;
  }

  /** Disconnects; the sandbox keeps running. */
  async dispose(): Promise<void> {
    await this.disconnect().catch(() => {});
  }

  /** Removes the sandbox for good (`provider.destroy`), then disconnects. */
  destroySandbox(): Promise<void> {
    return this.end((p, id) => p.destroy(id));
  }

  /** Pauses or stops the sandbox (`provider.pause`, else `destroy`); attach again with `sandboxId`. */
  pauseSandbox(): Promise<void> {
    return this.end((p, id) => (p.pause ? p.pause(id) : p.destroy(id)));
  }

  /** Deletes the sandbox at once (`provider.kill`, else `destroy`). */
  killSandbox(): Promise<void> {
    return this.end((p, id) => (p.kill ? p.kill(id) : p.destroy(id)));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.dispose();
  }

  private async end(step: (p: SandboxProvider, id: string) => Promise<void>): Promise<void> {
    const provider = this.provider;
    const rawId = this.rawId;
    if (!provider || rawId === undefined) throw new SandboxDetachedError();
    // Disconnect first: the agent's stream would otherwise end with an error as the sandbox goes.
    await this.dispose();
    this.provider = undefined;
    this.rawId = undefined;
    await step(provider, rawId);
  }
}

interface Endpoint {
  baseUrl: string;
  fetch?: typeof globalThis.fetch;
}

/** Where the daemon of a sandbox answers: the provider's URL and/or fetch (re-read after `ensureServer`). */
async function endpoint(provider: SandboxProvider, rawId: string, own?: typeof globalThis.fetch): Promise<Endpoint> {
  const fetch = own ?? (provider.getFetch ? await provider.getFetch(rawId) : undefined);
  const url = provider.getUrl ? await provider.getUrl(rawId) : undefined;
  return { baseUrl: (url ?? "http://sandbox").replace(/\/+$/, ""), fetch };
}

/**
 * Probes `/v1/health` with a doubling back-off until it answers 200 (resolves with the endpoint
 * that answered), a 401/403 (step auth), or the deadline (step health). After `ensureServerAfter`
 * failures in a row, calls `ensureServer` and asks the provider for the endpoint again (a
 * restarted server may have moved).
 */
async function waitForHealth(
  options: SandboxStartOptions,
  provider: SandboxProvider,
  rawId: string,
  id: string,
  first: Endpoint,
  token: string | undefined,
  reach: () => Promise<Endpoint>,
): Promise<Endpoint> {
  const timeoutMs = options.healthTimeoutMs ?? 120_000;
  const probeMs = options.probeTimeoutMs ?? 5_000;
  const ensureAfter = options.ensureServerAfter ?? 3;
  const deadline = Date.now() + timeoutMs;
  const headers: Record<string, string> = { ...(options.headers ?? {}) };
  if (token) headers.Authorization = `Bearer ${token}`;
  let where = first;
  let delay = FIRST_DELAY_MS;
  let failures = 0;
  let probes = 0;
  let last: unknown = new Error("no probe finished");
  for (;;) {
    options.signal?.throwIfAborted();
    probes++;
    const left = deadline - Date.now();
    const signals = [AbortSignal.timeout(Math.max(1, Math.min(probeMs, left)))];
    if (options.signal) signals.push(options.signal);
    try {
      const fetcher = where.fetch ?? globalThis.fetch;
      const res = await fetcher(`${where.baseUrl}/v1/health`, { headers, signal: AbortSignal.any(signals) });
      const body = await res.text().catch(() => "");
      if (res.status === 401 || res.status === 403) {
        throw new SandboxStartError(
          "auth",
          provider.name,
          id,
          new Error(`GET /v1/health answered ${res.status}: ${body.slice(0, 500)}`),
          `the daemon refused the token (HTTP ${res.status})`,
        );
      }
      if (res.ok) return where;
      last = new Error(`GET /v1/health answered ${res.status}: ${body.slice(0, 500)}`);
    } catch (error) {
      if (error instanceof SandboxStartError) throw error;
      options.signal?.throwIfAborted();
      last = error;
    }
    failures++;
    if (failures >= ensureAfter && provider.ensureServer) {
      failures = 0;
      try {
        await provider.ensureServer(rawId);
        where = await reach();
      } catch (error) {
        last = error;
      }
    }
    const wait = Math.min(delay, deadline - Date.now());
    if (wait <= 0) {
      throw new SandboxStartError(
        "health",
        provider.name,
        id,
        last,
        `GET ${where.baseUrl}/v1/health did not answer within ${timeoutMs} ms (${probes} probes; last: ${describe(last)})`,
      );
    }
    await sleep(wait, options.signal);
    delay = Math.min(MAX_DELAY_MS, delay * 2);
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    return cause instanceof Error ? `${error.message}: ${cause.message}` : error.message;
  }
  return String(error);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }
    function onAbort() {
      clearTimeout(timer);
      reject(signal!.reason);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
