/**
 * `SandboxAgentClient`: one agent instance on the daemon (one `serverId`), driven through
 * `acp-http-client`, plus the host APIs inherited from {@link HostApi}.
 *
 * Invariants: at most one connection per client (`connect()` while connected or connecting throws
 * {@link AlreadyConnectedError}); every session call throws {@link NotConnectedError} unless
 * connected (a call made while an auto-connect is under way waits for it and gets its failure);
 * the agent's permission requests are always answered (default: reject), so it never hangs on us.
 */
import type { AcpHttpClient, AcpStreamTransport, GapEvent, WebSocketLike, acp } from "acp-http-client";
import { AcpHttpError, toAcpError } from "acp-http-client/errors";
import {
  AgentError,
  AlreadyConnectedError,
  HttpError,
  NotConnectedError,
  PermissionReplyError,
  UnsupportedError,
} from "./errors.js";
import { HostApi, type HostOptions } from "./host.js";
import { InMemorySessionStore, type SessionRecord, type SessionStore } from "./session-store.js";

/** What the agent reported about a session (a message chunk, a tool call, a plan, …). */
export interface SessionUpdateEvent {
  sessionId: string;
  update: acp.SessionUpdate;
  serverId: string;
}

/** A permission the agent asks for before running a tool. */
export interface PermissionRequest {
  sessionId: string;
  toolCall: acp.ToolCallUpdate;
  options: acp.PermissionOption[];
}

/**
 * What `onPermissionRequest` returns: an option id to choose it (`"allow-once"`, or
 * `{ optionId }`), ACP's own `RequestPermissionResponse` (`{ outcome: { outcome: "selected",
 * optionId } }` or `{ outcome: { outcome: "cancelled" } }`), or `null`/`undefined` to cancel
 * (refuse without choosing). Anything else — or an option id the agent did not offer — is a
 * {@link PermissionReplyError}: the agent gets a JSON-RPC error, never a silent cancel.
 */
export type PermissionReply =
  | string
  | { optionId: string }
  | acp.RequestPermissionResponse
  | null
  | undefined;

export interface SandboxAgentClientOptions extends HostOptions {
  /** Agent to run (e.g. `claude`, `codex`, `mock`). */
  agent: string;
  /** Instance name on the daemon; default `sdk-<agent>-<uuid>`. Reuse one to re-attach. */
  serverId?: string;
  /** Connect from the constructor (default true); failures surface on `ready` and the first call. */
  autoConnect?: boolean;
  onSessionUpdate?: (event: SessionUpdateEvent) => void | Promise<void>;
  /** Answers the agent's permission requests; default: the first "reject" option (else cancel). */
  onPermissionRequest?: (request: PermissionRequest) => PermissionReply | Promise<PermissionReply>;
  /** Events were lost before this client read them (it fell too far behind). Default: console.warn. */
  onGap?: (gap: GapEvent) => void;
  /** Errors that belong to no call (a failed notification, a broken stream). */
  onError?: (error: Error) => void;
  /** Where session metadata is kept (default: in memory). */
  sessionStore?: SessionStore;
  /** Resume the event stream after this id (from a stored session) when re-attaching. */
  lastEventId?: number;
  /** Client name sent to the agent. */
  clientName?: string;
  /** After a prompt is answered, wait until its updates were delivered (default true; at most 5 s). */
  waitForUpdates?: boolean;
  /**
   * `sse` (default): a POST per message plus one event stream. `websocket`: one socket both ways
   * (needs a daemon with the WebSocket face; browsers cannot send the token on it).
   */
  transport?: "sse" | "websocket";
  /** Opens the socket for `transport: "websocket"` (default: the global `WebSocket`). */
  createWebSocket?: (url: string, headers: Record<string, string>) => WebSocketLike;
}

export interface NewSessionOptions {
  /** Working directory of the session; default: the daemon's work dir. */
  cwd?: string;
  mcpServers?: acp.McpServer[];
  title?: string;
  metadata?: Record<string, unknown>;
}

export interface PromptOptions {
  sessionId: string;
  /** Text, or content blocks. */
  prompt: string | acp.ContentBlock[];
}

type State = "disconnected" | "connecting" | "connected";

export class SandboxAgentClient extends HostApi {
  readonly agent: string;
  readonly serverId: string;
  /** Resolves when the auto-connect (or the latest `connect()`) finished; rejects with its failure. */
  ready: Promise<void>;

  private readonly options: SandboxAgentClientOptions;
  private readonly store: SessionStore;
  private state: State = "disconnected";
  private acpClient: AcpHttpClient | null = null;
  private connecting: Promise<void> | null = null;
  private pendingConnectError: unknown = null;
  private initResult: acp.InitializeResponse | null = null;
  private defaultCwd: string | null = null;
  private lastEventIdValue: number | null;

  constructor(options: SandboxAgentClientOptions) {
    super(options);
    if (!options.agent) throw new TypeError("agent is required");
    this.options = options;
    this.agent = options.agent;
    this.serverId = options.serverId ?? `sdk-${options.agent}-${uuid()}`;
    this.store = options.sessionStore ?? new InMemorySessionStore();
    this.lastEventIdValue = options.lastEventId ?? null;
    if (options.autoConnect ?? true) {
      this.ready = this.connect();
      // The failure is reported by `ready` and by the first call; never as an unhandled rejection.
      this.ready.catch(() => {});
    } else {
      this.ready = Promise.resolve();
    }
  }

  /** True while connected. */
  get connected(): boolean {
    return this.state === "connected";
  }

  /** What the agent said about itself on connect (`agentInfo`, capabilities, auth methods). */
  get agentInfo(): acp.InitializeResponse | null {
    return this.initResult;
  }

  /** The session store in use. */
  get sessions(): SessionStore {
    return this.store;
  }

  /** The id of the last event read from the instance's stream. */
  get lastEventId(): number | null {
    return this.acpClient?.transport.lastEventId ?? this.lastEventIdValue;
  }

  /** Starts (or attaches to) the agent instance and initializes it. */
  connect(): Promise<void> {
    if (this.state !== "disconnected") return Promise.reject(new AlreadyConnectedError());
    this.state = "connecting";
    this.pendingConnectError = null;
    const p = this.doConnect();
    this.connecting = p;
    this.ready = p;
    return p;
  }

  private async doConnect(): Promise<void> {
    let client: AcpHttpClient | null = null;
    try {
      // Loaded on first connect: the ACP SDK (and its schema validator) is most of this SDK's
      // weight, and a program that only uses the host APIs never needs it.
      const { AcpHttpClient } = await import("acp-http-client");
      client = new AcpHttpClient({
        baseUrl: this.baseUrl,
        serverId: this.serverId,
        agent: this.agent,
        token: this.token,
        fetch: this.fetcher,
        headers: this.extraHeaders,
        lastEventId: this.lastEventIdValue ?? undefined,
        onGap: this.options.onGap,
        onError: this.options.onError,
        transport: this.options.transport,
        createWebSocket: this.options.createWebSocket,
        client: {
          sessionUpdate: (n) => this.deliverUpdate(n),
          requestPermission: (r) => this.answerPermission(r),
        },
      });
      this.acpClient = client;
      this.initResult = await client.initialize({
        clientInfo: { name: this.options.clientName ?? "sandbox-agent-sdk", version: "0.5.0" },
      });
      this.state = "connected";
    } catch (error) {
      this.acpClient = null;
      this.state = "disconnected";
      await client?.close().catch(() => {});
      const converted = convertError(error, this.agent, "connect");
      this.pendingConnectError = converted;
      throw converted;
    } finally {
      this.connecting = null;
    }
  }

  /**
   * Closes the connection. By default the daemon stops the agent instance (DELETE); with
   * `{ stopAgent: false }` only this client goes away and another may re-attach to `serverId`.
   */
  async disconnect(options: { stopAgent?: boolean } = {}): Promise<void> {
    if (this.connecting) await this.connecting.catch(() => {});
    const client = this.acpClient;
    this.acpClient = null;
    this.state = "disconnected";
    this.pendingConnectError = null;
    if (!client) return;
    if (options.stopAgent ?? true) {
      // The instance and its event log are gone: a later connect() starts a new log at 0, and
      // resuming it after an id of the old one would be refused (400 Unknown Last-Event-ID).
      this.lastEventIdValue = null;
      await client.close();
    } else {
      this.lastEventIdValue = client.transport.lastEventId;
      await client.transport.detach();
    }
  }

  // --- ACP-aligned session calls -------------------------------------------------------------

  /** Creates a session and records it in the session store. */
  async newSession(options: NewSessionOptions = {}): Promise<acp.NewSessionResponse & { record: SessionRecord }> {
    const c = await this.conn();
    const cwd = options.cwd ?? (await this.workDir());
    const res = await this.run("newSession", () => c.newSession({ cwd, mcpServers: options.mcpServers ?? [] }));
    const now = new Date().toISOString();
    const record: SessionRecord = {
      id: res.sessionId,
      agent: this.agent,
      serverId: this.serverId,
      createdAt: now,
      updatedAt: now,
      lastEventId: c.transport.lastEventId,
      ...(options.title !== undefined ? { title: options.title } : {}),
      ...(options.metadata !== undefined ? { metadata: options.metadata } : {}),
    };
    await this.store.set(record);
    return { ...res, record };
  }

  /** Loads a session the agent kept (needs the agent's `loadSession` capability). */
  async loadSession(request: { sessionId: string; cwd?: string; mcpServers?: acp.McpServer[] }): Promise<acp.LoadSessionResponse> {
    const c = await this.conn();
    this.require(this.initResult?.agentCapabilities?.loadSession === true, "loadSession");
    const cwd = request.cwd ?? (await this.workDir());
    const res = await this.run("loadSession", () =>
      c.loadSession({ sessionId: request.sessionId, cwd, mcpServers: request.mcpServers ?? [] }),
    );
    await this.touch(request.sessionId);
    return res;
  }

  /** Resumes a session without replaying its history (needs `sessionCapabilities.resume`). */
  async resumeSession(request: { sessionId: string; cwd?: string; mcpServers?: acp.McpServer[] }): Promise<acp.ResumeSessionResponse> {
    const c = await this.conn();
    this.require(!!this.initResult?.agentCapabilities?.sessionCapabilities?.resume, "resumeSession");
    const cwd = request.cwd ?? (await this.workDir());
    const res = await this.run("resumeSession", () =>
      c.resumeSession({ sessionId: request.sessionId, cwd, mcpServers: request.mcpServers ?? [] }),
    );
    await this.touch(request.sessionId);
    return res;
  }

  /** Forks a session (needs `sessionCapabilities.fork`); the new session is recorded. */
  async forkSession(request: { sessionId: string; cwd?: string; mcpServers?: acp.McpServer[] }): Promise<acp.ForkSessionResponse> {
    const c = await this.conn();
    this.require(!!this.initResult?.agentCapabilities?.sessionCapabilities?.fork, "forkSession");
    const cwd = request.cwd ?? (await this.workDir());
    const res = await this.run("forkSession", () =>
      c.forkSession({ sessionId: request.sessionId, cwd, mcpServers: request.mcpServers ?? [] }),
    );
    const parent = await this.store.get(this.serverId, request.sessionId);
    const now = new Date().toISOString();
    await this.store.set({
      id: res.sessionId,
      agent: this.agent,
      serverId: this.serverId,
      createdAt: now,
      updatedAt: now,
      lastEventId: c.transport.lastEventId,
      ...(parent?.title !== undefined ? { title: parent.title } : {}),
      metadata: { ...parent?.metadata, forkedFrom: request.sessionId },
    });
    return res;
  }

  /**
   * ACP `session/list`: the agent's own list where it advertises `sessionCapabilities.list`,
   * else the daemon's answer from its inventory (this serverId's sessions). See also
   * `sessions.list()` and `listAllSessions()` (every serverId).
   */
  async listSessions(request: acp.ListSessionsRequest = {}): Promise<acp.ListSessionsResponse> {
    const c = await this.conn();
    return this.run("listSessions", () => c.listSessions(request));
  }

  /**
   * Sends a prompt; resolves with the stop reason once the agent answered and (by default) its
   * updates were delivered to `onSessionUpdate`.
   */
  async prompt(request: PromptOptions): Promise<acp.PromptResponse> {
    const c = await this.conn();
    const prompt: acp.ContentBlock[] =
      typeof request.prompt === "string" ? [{ type: "text", text: request.prompt }] : request.prompt;
    const res = await this.run("prompt", () => c.prompt({ sessionId: request.sessionId, prompt }));
    // Over a WebSocket the answer follows its updates on the same socket: nothing to wait for.
    if ((this.options.waitForUpdates ?? true) && this.options.transport !== "websocket") {
      await this.drainUpdates(c.transport);
    }
    await this.touch(request.sessionId);
    return res;
  }

  /**
   * Cancels the session's running prompt (which then ends with `stopReason: "cancelled"`): takes
   * the session id, or ACP's `CancelNotification` (`{ sessionId }`).
   */
  async cancel(session: string | { sessionId: string }): Promise<void> {
    const sessionId = typeof session === "string" ? session : session?.sessionId;
    if (typeof sessionId !== "string") throw new TypeError("cancel() takes a session id or { sessionId }");
    const c = await this.conn();
    await this.run("cancel", () => c.cancel({ sessionId }));
  }

  async setSessionMode(request: { sessionId: string; modeId: string }): Promise<acp.SetSessionModeResponse> {
    const c = await this.conn();
    return this.run("setSessionMode", () => c.setSessionMode(request));
  }

  async setSessionConfigOption(request: acp.SetSessionConfigOptionRequest): Promise<acp.SetSessionConfigOptionResponse> {
    const c = await this.conn();
    return this.run("setSessionConfigOption", () => c.setSessionConfigOption(request));
  }

  async setSessionModel(request: { sessionId: string; modelId: string }): Promise<Record<string, unknown>> {
    const c = await this.conn();
    return this.run("setSessionModel", () => c.setSessionModel(request));
  }

  // --- client-side metadata --------------------------------------------------------------------

  /** Sets the title and/or metadata of a recorded session of this instance. */
  async updateSession(sessionId: string, patch: { title?: string; metadata?: Record<string, unknown> }): Promise<SessionRecord> {
    const r = await this.store.get(this.serverId, sessionId);
    if (!r) throw new TypeError(`no recorded session ${sessionId} on ${this.serverId}`);
    if (patch.title !== undefined) r.title = patch.title;
    if (patch.metadata !== undefined) r.metadata = patch.metadata;
    r.updatedAt = new Date().toISOString();
    await this.store.set(r);
    return r;
  }

  // --- internals -----------------------------------------------------------------------------

  private async conn(): Promise<AcpHttpClient> {
    if (this.state === "connecting" && this.connecting) {
      await this.connecting.catch(() => {});
    }
    if (this.pendingConnectError !== null) {
      const e = this.pendingConnectError;
      this.pendingConnectError = null;
      throw e;
    }
    if (this.state !== "connected" || !this.acpClient) throw new NotConnectedError();
    return this.acpClient;
  }

  private require(ok: boolean, method: string) {
    if (!ok) throw new UnsupportedError(this.agent, method, "the agent does not advertise this capability");
  }

  private async run<T>(method: string, f: () => Promise<T>): Promise<T> {
    try {
      return await f();
    } catch (error) {
      throw convertError(error, this.agent, method);
    }
  }

  private async workDir(): Promise<string> {
    if (this.defaultCwd === null) {
      try {
        this.defaultCwd = (await this.stat(".")).path;
      } catch {
        this.defaultCwd = "/";
      }
    }
    return this.defaultCwd;
  }

  /**
   * A prompt's answer (POST body) can overtake its last updates (SSE). The daemon queues every
   * update before it answers, so once the stream reached the instance's `lastEventId` as listed
   * after the answer, all of them were delivered.
   */
  private async drainUpdates(transport: AcpStreamTransport): Promise<void> {
    try {
      // The answer named the last event logged before it; a daemon that does not (an older one)
      // is asked for the instance's newest event id instead (one more request).
      let target = transport.answeredEventId ?? null;
      if (target === null) {
        const me = (await this.listInstances()).find((s) => s.serverId === this.serverId);
        target = me ? me.lastEventId : 0;
      }
      if (target > 0) await transport.waitForEventId(target, 5000);
      // Updates are dispatched by the connection asynchronously (promise chains) after they are
      // read: one macrotask later they are all out. `setTimeout(0)` would cost 1 ms in Node.
      await nextMacrotask();
    } catch {
      // Best effort: the answer itself is what the caller waits for.
    }
  }

  private async touch(sessionId: string) {
    const r = await this.store.get(this.serverId, sessionId);
    if (!r) return;
    r.updatedAt = new Date().toISOString();
    r.lastEventId = this.lastEventId;
    await this.store.set(r);
  }

  private async deliverUpdate(n: acp.SessionNotification): Promise<void> {
    if (!this.options.onSessionUpdate) return;
    try {
      await this.options.onSessionUpdate({ sessionId: n.sessionId, update: n.update, serverId: this.serverId });
    } catch (error) {
      this.options.onError?.(error instanceof Error ? error : new Error(String(error)));
    }
  }

  private async answerPermission(r: acp.RequestPermissionRequest): Promise<acp.RequestPermissionResponse> {
    let reply: unknown;
    try {
      reply = this.options.onPermissionRequest
        ? await this.options.onPermissionRequest({ sessionId: r.sessionId, toolCall: r.toolCall, options: r.options })
        : defaultReply(r.options);
    } catch (error) {
      this.options.onError?.(error instanceof Error ? error : new Error(String(error)));
      reply = defaultReply(r.options);
    }
    const answer = permissionResponse(reply, r.options);
    if (answer instanceof PermissionReplyError) {
      // Reported to the caller (or the console), and the agent is told it was an error: the
      // reply was a bug on our side, not a decision to cancel.
      if (this.options.onError) this.options.onError(answer);
      else console.error(`sandbox-agent: ${answer.message}`);
      throw answer;
    }
    return answer;
  }
}

/** The ACP answer for a reply of `onPermissionRequest`, or why the reply is not one. */
export function permissionResponse(
  reply: unknown,
  options: acp.PermissionOption[],
): acp.RequestPermissionResponse | PermissionReplyError {
  const offered = (id: unknown): acp.RequestPermissionResponse | PermissionReplyError =>
    typeof id === "string" && options.some((o) => o.optionId === id)
      ? { outcome: { outcome: "selected", optionId: id } }
      : new PermissionReplyError(
          reply,
          `option ${JSON.stringify(id)} was not offered (offered: ${options.map((o) => o.optionId).join(", ")})`,
        );
  if (reply === null || reply === undefined) return { outcome: { outcome: "cancelled" } };
  if (typeof reply === "string") return offered(reply);
  if (typeof reply === "object") {
    const o = reply as Record<string, unknown>;
    if ("optionId" in o && !("outcome" in o)) return offered(o.optionId);
    const outcome = o.outcome as Record<string, unknown> | undefined;
    if (outcome && typeof outcome === "object") {
      if (outcome.outcome === "cancelled") return { outcome: { outcome: "cancelled" } };
      if (outcome.outcome === "selected") return offered(outcome.optionId);
    }
  }
  return new PermissionReplyError(
    reply,
    "expected an optionId, { optionId }, an ACP RequestPermissionResponse, or null to cancel",
  );
}

function defaultReply(options: acp.PermissionOption[]): PermissionReply {
  return options.find((o) => o.kind === "reject_once")?.optionId ??
    options.find((o) => String(o.kind).startsWith("reject"))?.optionId ??
    null;
}

/** Maps transport and agent errors to the SDK's classes. */
export function convertError(error: unknown, agent: string, method: string): unknown {
  const e = toAcpError(error);
  if (e instanceof AcpHttpError && !(e instanceof HttpError)) return new HttpError(e.problem);
  if (isRpcError(e)) {
    if (e.code === -32601) return new UnsupportedError(agent, method, e.message);
    return new AgentError(e.code, e.message, e.data);
  }
  return e;
}

/** A JSON-RPC error answered by the agent (the ACP SDK's `RequestError`, duck-typed). */
function isRpcError(e: unknown): e is { code: number; message: string; data?: unknown } {
  return e instanceof Error && typeof (e as { code?: unknown }).code === "number";
}

function uuid(): string {
  const c = globalThis.crypto;
  if (c?.randomUUID) {
    try {
      return c.randomUUID();
    } catch {
      // randomUUID exists only in secure contexts in browsers; fall back below.
    }
  }
  const b = new Uint8Array(16);
  c.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

/**
 * Resolves after the current macrotask and every microtask it queued: `setImmediate` where there
 * is one (Node; looked up on `globalThis`, since browsers have none and their typings lack it).
 */
function nextMacrotask(): Promise<void> {
  const immediate = (globalThis as { setImmediate?: (callback: () => void) => unknown }).setImmediate;
  return new Promise((resolve) => {
    if (typeof immediate === "function") immediate(() => resolve());
    else setTimeout(resolve, 0);
  });
}
