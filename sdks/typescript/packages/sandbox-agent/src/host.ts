/**
 * The daemon's host APIs as plain methods (health, agents, instances, files, config, processes):
 * one HTTP call each (following a log and a terminal socket live in processes.ts), no connection
 * needed.
 *
 * Invariants: bodies and downloads stream (a 200 MB file never sits in memory unless the caller asks
 * for bytes); every non-2xx answer becomes an {@link HttpError} with the problem body.
 */
import { networkProblem, problemFromResponse } from "acp-http-client/errors";
import { HttpError } from "./errors.js";
import {
  explainTerminalRefusal,
  followProcessLogs,
  openTerminalSocket,
  processTerminalUrl,
  ProcessTerminalSession,
  type FollowProcessLogsOptions,
  type ProcessContext,
  type ProcessLogListener,
  type ProcessLogSubscription,
  type ProcessTerminalConnectOptions,
  type ProcessTerminalUrlOptions,
} from "./processes.js";
import { BrowserApi } from "./browser.js";
import { DesktopApi } from "./desktop.js";
import { watchFs, type WatchItem, type WatchOptions } from "./watch.js";
import type {
  AgentInfo,
  FsEntry,
  FsStat,
  Health,
  InstallAgentRequest,
  InstallAgentResult,
  InstanceInfo,
  SessionPage,
  McpEntry,
  MoveRequest,
  ProcessConfig,
  ProcessCreateRequest,
  ProcessInfo,
  ProcessInputRequest,
  ProcessInputResponse,
  ProcessListQuery,
  ProcessListResponse,
  ProcessLogFollowQuery,
  ProcessLogsResponse,
  ProcessRunRequest,
  ProcessRunResponse,
  ProcessSignalQuery,
  ProcessTerminalResizeRequest,
  ProcessTerminalResizeResponse,
  MoveResult,
  PathResult,
  SkillsEntry,
  UploadBatchResult,
  WriteFileResult,
  GitBranches,
  GitCheckedOut,
  GitCheckoutRequest,
  GitCloneRequest,
  GitCommitRequest,
  GitDiff,
  GitLog,
  GitSha,
  GitStatus,
  GitWorktree,
  GitWorktreeRequest,
  GlobQuery,
  GlobResult,
  GrepQuery,
  GrepResult,
  PortInfo,
  Preview,
  Page,
  PageQuery,
} from "./types.js";

export interface HostOptions {
  /** Base URL of the daemon, e.g. `http://127.0.0.1:2468`. */
  baseUrl: string;
  /** Bearer token, when the daemon has one. */
  token?: string;
  /** `fetch` to use (defaults to the global one). */
  fetch?: typeof fetch;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
}

/** What `writeFile` and `uploadBatch` accept as a body. */
/** What `importSession` answers. */
export interface ImportedSession {
  serverId: string;
  agent: string;
  /** The imported session ids. */
  sessions: string[];
  /** Events imported (with their original ids). */
  events: number;
  /** The agent's session files written on this machine. */
  files: string[];
}

export type BodySource = ReadableStream<Uint8Array> | Uint8Array | ArrayBuffer | Blob | string;

export interface ConfigKey {
  /** Directory whose `.sandbox-agent/config/` holds the entry. */
  directory: string;
}

type Query = Record<string, string | number | boolean | undefined>;

export class HostApi {
  /** The daemon's base URL, without a trailing slash. */
  readonly baseUrl: string;
  protected readonly token?: string;
  protected readonly fetcher: typeof fetch;
  protected readonly extraHeaders: Record<string, string>;

  constructor(options: HostOptions) {
    if (!options.baseUrl) throw new TypeError("baseUrl is required");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.fetcher = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.extraHeaders = options.headers ?? {};
  }

  /** The desktop routes (`/v1/desktop/*`) and its live view. */
  get desktop(): DesktopApi {
    return new DesktopApi({
      json: (method, path, init) => this.json(method, path, init),
      send: (method, path, init) => this.send(method, path, init),
      context: this.processContext(),
    });
  }

  /** The browser routes (`/v1/browser/*`) and the DevTools proxy's URLs. */
  get browser(): BrowserApi {
    return new BrowserApi({
      json: (method, path, init) => this.json(method, path, init),
      send: (method, path, init) => this.send(method, path, init),
      context: this.processContext(),
    });
  }

  getHealth(): Promise<Health> {
    return this.json("GET", "/v1/health");
  }

  async listAgents(): Promise<AgentInfo[]> {
    return (await this.json<{ agents: AgentInfo[] }>("GET", "/v1/agents")).agents;
  }

  getAgent(agent: string): Promise<AgentInfo> {
    return this.json("GET", `/v1/agents/${encodeURIComponent(agent)}`);
  }

  installAgent(agent: string, request: InstallAgentRequest = {}): Promise<InstallAgentResult> {
    return this.json("POST", `/v1/agents/${encodeURIComponent(agent)}/install`, { body: request });
  }

  /** Every agent instance (`serverId`) the daemon runs, with its status and process figures. */
  async listInstances(): Promise<InstanceInfo[]> {
    return (await this.json<{ servers: InstanceInfo[] }>("GET", "/v1/acp")).servers;
  }
  /** One page of the instances, by `serverId` (see {@link PageQuery}). */
  async listInstancesPage(query: PageQuery = {}): Promise<Page<InstanceInfo>> {
    const r = await this.json<{ servers: InstanceInfo[]; nextCursor?: string }>("GET", "/v1/acp", { query: { ...query } });
    return { items: r.servers, nextCursor: r.nextCursor };
  }
  /** One page of the known agents, by id. */
  async listAgentsPage(query: PageQuery = {}): Promise<Page<AgentInfo>> {
    const r = await this.json<{ agents: AgentInfo[]; nextCursor?: string }>("GET", "/v1/agents", { query: { ...query } });
    return { items: r.agents, nextCursor: r.nextCursor };
  }
  /** One page of a directory's entries, by name (the cursor travels in a response header). */
  async listEntriesPage(path: string | undefined, query: PageQuery = {}): Promise<Page<FsEntry>> {
    const res = await this.send("GET", "/v1/fs/entries", { query: { path, ...query } });
    const next = res.headers.get("sandbox-agent-next-cursor") ?? undefined;
    return { items: (await res.json()) as FsEntry[], nextCursor: next };
  }

  /**
   * One page of every ACP session the daemon knows, across all serverIds (`GET /v1/sessions`):
   * live, exited and restored after a restart, with agent, cwd, title, times and state. Pass the
   * page's `nextCursor` as `cursor` for the next one. (`listSessions` is the ACP method of one
   * connected agent; this is the daemon's inventory.)
   */
  listAllSessions(options: { limit?: number; cursor?: string; serverId?: string } = {}): Promise<SessionPage> {
    return this.json("GET", "/v1/sessions", {
      query: {
        limit: options.limit === undefined ? undefined : String(options.limit),
        cursor: options.cursor,
        serverId: options.serverId,
      },
    });
  }

  listEntries(path?: string): Promise<FsEntry[]> {
    return this.json("GET", "/v1/fs/entries", { query: { path } });
  }

  /**
   * Every change beneath the directory `path` as it happens (`GET /v1/fs/watch`), as an async
   * iterator that reconnects by itself; `{ kind: "rescan" }` items say where changes may have been
   * missed (see watch.ts). Break out of the loop or abort `signal` to stop.
   */
  watch(path: string, options: WatchOptions = {}): AsyncGenerator<WatchItem> {
    return watchFs(this.processContext(), path, options);
  }

  stat(path: string): Promise<FsStat> {
    return this.json("GET", "/v1/fs/stat", { query: { path } });
  }

  /**
   * The file's bytes as a stream (nothing is buffered). `range` is an HTTP byte range, e.g. `bytes=0-99`.
   * In Node, the process's peak RSS while streaming is fetch's and V8's: docs/sdk-typescript.md
   * ("Streaming 200 MB in under 100 MB of RSS") lists the flags that bound it.
   */
  async readFileStream(path: string, options: { range?: string } = {}): Promise<ReadableStream<Uint8Array>> {
    const res = await this.send("GET", "/v1/fs/file", {
      query: { path },
      headers: options.range ? { Range: options.range } : {},
    });
    if (!res.body) throw new HttpError(networkProblem(new Error("response has no body")));
    return res.body;
  }

  /** The whole file in memory. */
  async readFile(path: string, options: { range?: string } = {}): Promise<Uint8Array> {
    const res = await this.send("GET", "/v1/fs/file", {
      query: { path },
      headers: options.range ? { Range: options.range } : {},
    });
    return new Uint8Array(await res.arrayBuffer());
  }

  /** Writes (atomically replaces) a file from bytes, text, a Blob or a stream. */
  writeFile(path: string, body: BodySource): Promise<WriteFileResult> {
    return this.json("PUT", "/v1/fs/file", {
      query: { path },
      raw: body,
      headers: { "Content-Type": "application/octet-stream" },
    });
  }

  deleteEntry(path: string, options: { recursive?: boolean } = {}): Promise<PathResult> {
    return this.json("DELETE", "/v1/fs/entry", {
      query: { path, recursive: options.recursive ? "true" : undefined },
    });
  }

  /** `mkdir -p`. */
  mkdir(path: string): Promise<PathResult> {
    return this.json("POST", "/v1/fs/mkdir", { query: { path } });
  }

  move(request: MoveRequest): Promise<MoveResult> {
    return this.json("POST", "/v1/fs/move", { body: request });
  }

  /**
   * A serverId's session bundle (tar+gzip) as a stream, nothing buffered: its event log, its
   * sessions and the agent's own session files (docs/acp.md, "Session bundles"). Taken between
   * turns: a turn in progress is a 409 {@link HttpError}.
   */
  async exportSession(serverId: string): Promise<ReadableStream<Uint8Array>> {
    const res = await this.send("GET", `/v1/acp/${encodeURIComponent(serverId)}/bundle`);
    if (!res.body) throw new HttpError(networkProblem(new Error("response has no body")));
    return res.body;
  }

  /**
   * Imports a bundle (a stream, bytes or a Blob) as `serverId` on this daemon; its next POST
   * restores the sessions. `cwd` maps each old absolute cwd to the new one.
   */
  importSession(
    serverId: string,
    bundle: BodySource,
    options: { cwd?: Record<string, string> } = {},
  ): Promise<ImportedSession> {
    const maps = Object.entries(options.cwd ?? {})
      .map(([from, to]) => `cwd=${encodeURIComponent(`${from}=${to}`)}`)
      .join("&");
    const path = `/v1/acp/${encodeURIComponent(serverId)}/bundle${maps ? `?${maps}` : ""}`;
    return this.json("POST", path, {
      raw: bundle,
      headers: { "Content-Type": "application/gzip" },
    });
  }

  /** Extracts a tar (or, with `gzip`, tar.gz) archive into `path` (default: the work dir), all or nothing. */
  uploadBatch(archive: BodySource, options: { path?: string; gzip?: boolean } = {}): Promise<UploadBatchResult> {
    return this.json("POST", "/v1/fs/upload-batch", {
      query: { path: options.path },
      raw: archive,
      headers: { "Content-Type": options.gzip ? "application/gzip" : "application/x-tar" },
    });
  }

  getMcpConfig(key: ConfigKey & { mcpName: string }): Promise<McpEntry> {
    return this.json("GET", "/v1/config/mcp", { query: { ...key } });
  }
  async setMcpConfig(key: ConfigKey & { mcpName: string }, entry: McpEntry): Promise<void> {
    await this.send("PUT", "/v1/config/mcp", { query: { ...key }, body: entry });
  }
  async deleteMcpConfig(key: ConfigKey & { mcpName: string }): Promise<void> {
    await this.send("DELETE", "/v1/config/mcp", { query: { ...key } });
  }

  getSkillsConfig(key: ConfigKey & { skillName: string }): Promise<SkillsEntry> {
    return this.json("GET", "/v1/config/skills", { query: { ...key } });
  }
  async setSkillsConfig(key: ConfigKey & { skillName: string }, entry: SkillsEntry): Promise<void> {
    await this.send("PUT", "/v1/config/skills", { query: { ...key }, body: entry });
  }
  async deleteSkillsConfig(key: ConfigKey & { skillName: string }): Promise<void> {
    await this.send("DELETE", "/v1/config/skills", { query: { ...key } });
  }

  // Processes (`/v1/processes`; docs/processes.md), with the names and shapes of the published
  // `sandbox-agent` 0.4.2 SDK.

  getProcessConfig(): Promise<ProcessConfig> {
    return this.json("GET", "/v1/processes/config");
  }
  /** Replaces the runtime limits (all six members) until the daemon stops. */
  setProcessConfig(config: ProcessConfig): Promise<ProcessConfig> {
    return this.json("POST", "/v1/processes/config", { body: config });
  }
  /** Runs to completion (stdin closed, output captured up to a limit, killed at the timeout). */
  runProcess(request: ProcessRunRequest): Promise<ProcessRunResponse> {
    return this.json("POST", "/v1/processes/run", { body: request });
  }
  /** Starts a background process (optionally on a terminal, `tty`, and with stdin, `interactive`). */
  createProcess(request: ProcessCreateRequest): Promise<ProcessInfo> {
    return this.json("POST", "/v1/processes", { body: request });
  }
  listProcesses(query: ProcessListQuery = {}): Promise<ProcessListResponse> {
    return this.json("GET", "/v1/processes", { query: { ...query } });
  }
  getProcess(id: string): Promise<ProcessInfo> {
    return this.json("GET", processPath(id));
  }
  /** SIGTERM to the tree, the grace period, then SIGKILL; with `waitMs`, answers once it exited (or then). */
  stopProcess(id: string, query: ProcessSignalQuery = {}): Promise<ProcessInfo> {
    return this.json("POST", `${processPath(id)}/stop`, { query: { ...query } });
  }
  /** SIGKILL to the tree at once. */
  killProcess(id: string, query: ProcessSignalQuery = {}): Promise<ProcessInfo> {
    return this.json("POST", `${processPath(id)}/kill`, { query: { ...query } });
  }
  /** Forgets an exited process and its log (409 while it runs). */
  async deleteProcess(id: string): Promise<void> {
    await this.send("DELETE", processPath(id));
  }
  /** A page of the output log: `since` a byte offset, the last `tail` entries, one `stream`. */
  getProcessLogs(id: string, query: ProcessLogFollowQuery = {}): Promise<ProcessLogsResponse> {
    return this.json("GET", `${processPath(id)}/logs`, { query: { ...query } });
  }
  /**
   * Follows the output log (SSE): `listener` gets every entry once, in order, across dropped
   * streams (resumed with `Last-Event-ID`); dropped output is reported to `options.onGap`.
   * Resolves once the stream is open; `closed` settles when following ends.
   */
  followProcessLogs(
    id: string,
    listener: ProcessLogListener,
    query: ProcessLogFollowQuery = {},
    options: FollowProcessLogsOptions = {},
  ): Promise<ProcessLogSubscription> {
    return followProcessLogs(this.processContext(), id, listener, query, options);
  }
  /** Writes to stdin or the terminal: `data` is base64 unless `encoding` is `utf8`. */
  sendProcessInput(id: string, request: ProcessInputRequest): Promise<ProcessInputResponse> {
    return this.json("POST", `${processPath(id)}/input`, { body: request });
  }
  resizeProcessTerminal(id: string, request: ProcessTerminalResizeRequest): Promise<ProcessTerminalResizeResponse> {
    return this.json("POST", `${processPath(id)}/terminal/resize`, { body: request });
  }
  /** The terminal WebSocket's URL, with the token as `?access_token=` (for a browser's WebSocket). */
  buildProcessTerminalWebSocketUrl(id: string, options: ProcessTerminalUrlOptions = {}): string {
    return processTerminalUrl(this.processContext(), id, options.accessToken ?? this.token);
  }
  /** The raw terminal WebSocket (see {@link ProcessTerminalConnectOptions} for how the token travels). */
  connectProcessTerminalWebSocket(id: string, options: ProcessTerminalConnectOptions = {}): WebSocket {
    return openTerminalSocket(this.processContext(), id, options);
  }
  /** The terminal as a session: `onData`, `sendInput`, `resize`, `onExit`, `close`, `ready`. */
  connectProcessTerminal(id: string, options: ProcessTerminalConnectOptions = {}): ProcessTerminalSession {
    const ctx = this.processContext();
    return new ProcessTerminalSession(openTerminalSocket(ctx, id, options), () => explainTerminalRefusal(ctx, id));
  }

  // The workspace API (docs/workspace.md): git, search, ports, the proxy and preview links.

  /** Branch, HEAD and changed files of the repository `path` is in. */
  gitStatus(path: string): Promise<GitStatus> {
    return this.json("GET", "/v1/git/status", { query: { path } });
  }
  /** The work tree (untracked files included) against `base` (default HEAD). */
  gitDiff(path: string, base?: string): Promise<GitDiff> {
    return this.json("GET", "/v1/git/diff", { query: { path, base } });
  }
  gitLog(path: string, limit?: number): Promise<GitLog> {
    return this.json("GET", "/v1/git/log", { query: { path, limit } });
  }
  /** Commits what is staged (everything with `all`); 409 when there is nothing to commit. */
  gitCommit(request: GitCommitRequest): Promise<GitSha> {
    return this.json("POST", "/v1/git/commit", { body: request });
  }
  gitBranches(path: string): Promise<GitBranches> {
    return this.json("GET", "/v1/git/branches", { query: { path } });
  }
  /** Switches branch (creating it with `create`); 409 when local changes would be overwritten. */
  gitCheckout(request: GitCheckoutRequest): Promise<GitCheckedOut> {
    return this.json("POST", "/v1/git/checkout", { body: request });
  }
  async listWorktrees(path: string): Promise<GitWorktree[]> {
    const r = await this.json<{ worktrees: GitWorktree[] }>("GET", "/v1/git/worktrees", { query: { path } });
    return r.worktrees;
  }
  /** A new worktree on a new branch: a work tree of its own for one agent. */
  addWorktree(request: GitWorktreeRequest): Promise<GitWorktree> {
    return this.json("POST", "/v1/git/worktrees", { body: request });
  }
  /** Removes a worktree; one with changes needs `force` (else 409). */
  async removeWorktree(path: string, options: { force?: boolean } = {}): Promise<void> {
    await this.send("DELETE", "/v1/git/worktrees", { query: { path, force: options.force } });
  }
  /**
   * Clones into `dest`. Over https, `username` + `password` (Basic) or `password` alone (a
   * Bearer token) are used for this clone only, never stored; a remote that refuses them is 422.
   */
  gitClone(request: GitCloneRequest): Promise<GitWorktree> {
    return this.json("POST", "/v1/git/clone", { body: request });
  }
  /** Files whose path matches a gitignore-style glob. */
  glob(query: GlobQuery): Promise<GlobResult> {
    return this.json("GET", "/v1/fs/glob", { query: { ...query } });
  }
  /** Lines matching a regular expression (gitignore-aware, binary files skipped). */
  grep(query: GrepQuery): Promise<GrepResult> {
    return this.json("GET", "/v1/fs/grep", { query: { ...query } });
  }
  /** The TCP listeners inside the sandbox. */
  async listPorts(): Promise<PortInfo[]> {
    const r = await this.json<{ ports: PortInfo[] }>("GET", "/v1/ports");
    return r.ports;
  }
  /** One page of the TCP listeners, by port and address. */
  async listPortsPage(query: PageQuery = {}): Promise<Page<PortInfo>> {
    const r = await this.json<{ ports: PortInfo[]; nextCursor?: string }>("GET", "/v1/ports", { query: { ...query } });
    return { items: r.ports, nextCursor: r.nextCursor };
  }
  /** The URL of `path` on `port` through the daemon's proxy (needs the token). */
  portProxyUrl(port: number, path = "/"): string {
    return `${this.baseUrl}/v1/ports/${port}/proxy/${path.replace(/^\/+/, "")}`;
  }
  /**
   * A signed link to `port` that works without the token until it expires (`ttl`: `10m`, `2h`;
   * default 1h). `url` is absolute here (the daemon answers it relative to its address).
   */
  async createPreview(port: number, options: { ttl?: string } = {}): Promise<Preview> {
    const p = await this.json<Preview>("POST", `/v1/ports/${port}/preview`, { body: { ...options } });
    return { ...p, url: this.baseUrl + p.url };
  }

  private processContext(): ProcessContext {
    return {
      url: (path, query) => this.url(path, query),
      headers: () => this.authHeaders(),
      token: this.token,
      fetcher: this.fetcher,
    };
  }

  protected url(path: string, query: Query = {}): URL {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query)) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    return url;
  }

  protected authHeaders(): Record<string, string> {
    const h: Record<string, string> = { ...this.extraHeaders };
    if (this.token) h.Authorization = `Bearer ${this.token}`;
    return h;
  }

  protected async json<T>(
    method: string,
    path: string,
    init: { query?: Query; body?: unknown; raw?: BodySource; headers?: Record<string, string> } = {},
  ): Promise<T> {
    const res = await this.send(method, path, init);
    return (await res.json()) as T;
  }

  /** One request; resolves with a 2xx response, throws {@link HttpError} otherwise. */
  protected async send(
    method: string,
    path: string,
    init: { query?: Query; body?: unknown; raw?: BodySource; headers?: Record<string, string> } = {},
  ): Promise<Response> {
    const url = this.url(path, init.query);
    const headers: Record<string, string> = { ...this.authHeaders(), ...init.headers };
    const req: RequestInit & { duplex?: "half" } = { method, headers };
    if (init.body !== undefined) {
      headers["Content-Type"] = "application/json";
      req.body = JSON.stringify(init.body);
    } else if (init.raw !== undefined) {
      req.body = init.raw as BodyInit;
      if (init.raw instanceof ReadableStream) {
        // A stream body needs half-duplex in fetch (Node and browsers alike). `redirect: "error"`
        // matters for memory: otherwise fetch clones the request for a possible redirect, which
        // tees the body and keeps every chunk sent until the answer (measured: a 200 MB upload
        // held 200 MB in Node 20's fetch). The daemon never redirects.
        req.duplex = "half";
        req.redirect = "error";
      }
    }
    let res: Response;
    try {
      res = await this.fetcher(url, req);
    } catch (error) {
      throw new HttpError(networkProblem(error, url), { cause: error });
    }
    if (!res.ok) throw new HttpError(await problemFromResponse(res));
    return res;
  }
}

function processPath(id: string): string {
  return `/v1/processes/${encodeURIComponent(id)}`;
}
