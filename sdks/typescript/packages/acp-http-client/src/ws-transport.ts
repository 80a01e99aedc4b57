/**
 * The same ACP stream over the daemon's WebSocket face of `/v1/acp/{serverId}` (`GET` with
 * `Upgrade: websocket`; docs/acp.md): one socket carries every message both ways as JSON text
 * frames, so ordering between answers and updates is the daemon's log order.
 *
 * Event ids are implicit: after connecting with `lastEventId=n` (n = 0 without it) the event
 * frames are n+1, n+2, …; a `_sandboxagent/gap` notification `{from,to}` says the next event is
 * `to+1`; JSON-RPC error frames whose `error.data` is a problem (`urn:sandbox-agent:problem:…`) are
 * not events. A dropped socket (or close 1008, "fell behind") is re-opened with `lastEventId`
 * after a backoff; close 1000 (agent ended or serverId deleted) ends the stream.
 *
 * Invariants: no Node-only API (a `WebSocket` constructor is all it needs); writes while the
 * socket is down wait for it (backpressure for the connection) and fail once the transport ended;
 * every wait is bounded as in the SSE transport.
 */
import type { AnyMessage } from "@agentclientprotocol/sdk";
import {
  AcpHttpError,
  AcpTransportClosedError,
  isProblemDetails,
  problemFromResponse,
  type ProblemDetails,
} from "./errors.js";
import { AcpStreamBase, idKey } from "./stream-base.js";
import { sleep, type AcpHttpTransportOptions, type GapEvent } from "./transport.js";

/** What the transport needs of a WebSocket (the WHATWG interface; `ws` and undici fit). */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}

export interface AcpWebSocketTransportOptions extends AcpHttpTransportOptions {
  /**
   * Opens a socket. Default: the global `WebSocket`; with a token, `new WebSocket(url, { headers })`
   * in Node (the form its built-in WebSocket and the `ws` package accept). A browser's WebSocket
   * cannot send headers: there the token goes in the URL as `?access_token=`, which the daemon
   * accepts on WebSocket upgrades only.
   */
  createWebSocket?: (url: string, headers: Record<string, string>) => WebSocketLike;
}

const GAP_METHOD = "_sandboxagent/gap";
const OPEN = 1;

export class AcpWebSocketTransport extends AcpStreamBase {
  private readonly opts: AcpWebSocketTransportOptions;
  private readonly wsUrl: string;
  private socket: WebSocketLike | null = null;
  private opened: Promise<void> | null = null;
  private everOpened = false;
  private counter: number;
  private delay: number;
  private readonly stopWaiting = new AbortController();
  /** Requests sent and not yet answered (by JSON-RPC id), to fail them if the agent ends. */
  private readonly pending = new Map<string, string | number>();

  constructor(options: AcpWebSocketTransportOptions) {
    super(options);
    this.opts = options;
    this.wsUrl = this.httpUrl.replace(/^http/, "ws");
    this.counter = this.lastId ?? 0;
    this.delay = options.reconnectInitialMs ?? 100;
  }

  protected async closeImpl(deleteServer: boolean) {
    this.stopWaiting.abort();
    const s = this.socket;
    this.socket = null;
    try {
      s?.close(1000, "client closed");
    } catch {
      // already closed
    }
    if (deleteServer && this.everOpened) {
      try {
        const res = await this.fetcher(this.httpUrl, {
          method: "DELETE",
          headers: this.headers(),
          signal: AbortSignal.timeout(this.opts.closeTimeoutMs ?? 2000),
        });
        await res.body?.cancel().catch(() => {});
      } catch {
        // bounded; the daemon stops the agent in the background anyway
      }
    }
    this.finish();
  }

  private headers(): Record<string, string> {
    const h: Record<string, string> = { ...this.opts.headers };
    if (this.opts.token) h.Authorization = `Bearer ${this.opts.token}`;
    return h;
  }

  protected async send(message: AnyMessage): Promise<void> {
    if (this.isClosed) throw new AcpTransportClosedError();
    await this.ensureOpen();
    const s = this.socket;
    if (!s || s.readyState !== OPEN || this.isClosed) throw new AcpTransportClosedError();
    this.opts.onEnvelope?.(message, "outbound");
    const m = message as Record<string, unknown>;
    if (typeof m.method === "string" && (typeof m.id === "string" || typeof m.id === "number")) {
      this.pending.set(idKey(m.id), m.id);
    }
    s.send(JSON.stringify(message));
  }

  /** Resolves once a socket is open (opening or re-opening one as needed); rejects once ended. */
  private ensureOpen(): Promise<void> {
    if (this.socket && this.socket.readyState === OPEN) return Promise.resolve();
    if (!this.opened) {
      this.opened = this.openLoop().finally(() => {
        this.opened = null;
      });
    }
    return this.opened;
  }

  private async openLoop(): Promise<void> {
    const max = this.opts.reconnectMaxMs ?? 5000;
    for (;;) {
      if (this.isClosed) throw new AcpTransportClosedError();
      try {
        await this.openOnce();
        return;
      } catch (error) {
        if (this.isClosed) throw new AcpTransportClosedError();
        if (!this.everOpened) {
          // The very first open: report why at once (bad agent, auth, …) instead of retrying.
          // The event-stream endpoint refuses for the same reasons (401, 400, 410), except that a
          // serverId the refused upgrade never created is simply unknown to it (404).
          const problem = await this.probe();
          const e = problem && problem.status !== 404 ? new AcpHttpError(problem) : toNetworkError(error);
          this.fail(e);
          throw e;
        }
        const problem = await this.probe();
        if (problem && (problem.status === 404 || problem.status === 410)) {
          this.endError = new AcpHttpError(problem);
          this.finish();
          throw new AcpTransportClosedError(`the ACP server ended: ${problem.title}`);
        }
        if (problem && problem.status >= 400 && problem.status < 500 && problem.status !== 408 && problem.status !== 429) {
          const e = new AcpHttpError(problem);
          this.fail(e);
          throw e;
        }
        this.reconnectCount++;
        await sleep(this.delay, this.stopWaiting.signal);
        this.delay = Math.min(this.delay * 2, max);
      }
    }
  }

  /**
   * Why an upgrade failed: browsers hide the HTTP answer of a refused upgrade, so ask the event
   * stream endpoint the same question (its refusals are the same: 400, 401, 404, 409, 410).
   */
  private async probe(): Promise<ProblemDetails | null> {
    const ac = new AbortController();
    try {
      const url = new URL(this.httpUrl);
      const res = await this.fetcher(url, {
        headers: { ...this.headers(), Accept: "text/event-stream" },
        signal: AbortSignal.any ? AbortSignal.any([ac.signal, AbortSignal.timeout(5000)]) : ac.signal,
      });
      if (res.ok) return null;
      return await problemFromResponse(res);
    } catch {
      return null;
    } finally {
      ac.abort();
    }
  }

  private openOnce(): Promise<void> {
    const params = new URLSearchParams();
    if (!this.everOpened && this.opts.agent) params.set("agent", this.opts.agent);
    if (this.lastId !== null) params.set("lastEventId", String(this.lastId));
    const q = params.toString();
    const url = q ? `${this.wsUrl}?${q}` : this.wsUrl;
    const headers = this.headers();
    const ws = this.opts.createWebSocket
      ? this.opts.createWebSocket(url, headers)
      : defaultWebSocket(url, headers, this.opts.token);
    return new Promise((resolve, reject) => {
      let open = false;
      ws.onopen = () => {
        open = true;
        this.everOpened = true;
        this.socket = ws;
        this.counter = this.lastId ?? 0;
        resolve();
      };
      ws.onerror = () => {
        // The close event follows and decides.
      };
      ws.onmessage = (ev) => {
        if (typeof ev.data === "string") this.onFrame(ev.data);
      };
      ws.onclose = (ev) => {
        if (!open) return reject(new Error(`WebSocket closed before opening (${ev.code})`));
        if (this.socket === ws) this.socket = null;
        this.onClose(ev.code, ev.reason);
      };
    });
  }

  private onFrame(text: string) {
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(text) as Record<string, unknown>;
    } catch {
      this.opts.onError?.(new Error("a WebSocket frame is not JSON; skipped"));
      return;
    }
    if (msg.method === GAP_METHOD) {
      const gap = (msg.params ?? {}) as GapEvent;
      this.counter = Number(gap.to);
      if (this.opts.onGap) this.opts.onGap(gap);
      else console.warn(`acp-http-client: events ${gap.from}..${gap.to} were lost (gap)`);
      return;
    }
    const err = msg.error as { data?: unknown } | undefined;
    const isDaemonError =
      msg.method === undefined && err !== undefined && isProblemDetails(err.data) &&
      String(err.data.type).startsWith("urn:sandbox-agent:problem:");
    if (!isDaemonError) {
      this.counter++;
      this.lastId = this.counter;
      this.delay = this.opts.reconnectInitialMs ?? 100;
    }
    if (msg.method === undefined && (typeof msg.id === "string" || typeof msg.id === "number")) {
      this.pending.delete(idKey(msg.id));
    }
    if (isDaemonError && (msg.id === null || msg.id === undefined)) {
      this.opts.onError?.(new AcpHttpError((err as { data: ProblemDetails }).data));
    } else {
      this.opts.onEnvelope?.(msg as AnyMessage, "inbound");
      try {
        this.controller.enqueue(msg as AnyMessage);
      } catch {
        // reader gone
      }
    }
    this.wakeIdWaiters();
  }

  private onClose(code: number, reason: string) {
    if (this.isClosed) return;
    if (code === 1000) {
      // The agent ended (everything delivered) or the serverId was deleted.
      this.endError = new AcpHttpError({ type: "about:blank", title: reason || "the ACP server ended", status: 410 });
      void this.failPendingThenFinish();
      return;
    }
    if (code === 1001 || code === 1009) {
      this.fail(new AcpHttpError({ type: "about:blank", title: reason || `WebSocket closed (${code})`, status: 0 }));
      return;
    }
    // 1008 (fell behind), 1006 (dropped) and the rest: resume with lastEventId.
    this.reconnectCount++;
    this.ensureOpen().catch(() => {});
  }

  /**
   * The daemon closes the socket when the agent ends without answering the requests that were
   * waiting on it. Each of them is failed with a problem built from the instance's listing
   * (`GET /v1/acp`: exit code, signal, exit reason), so the caller learns why — as over SSE,
   * where such a request gets its own 502. (The listing has no stderr tail.)
   */
  private async failPendingThenFinish() {
    if (this.pending.size > 0) {
      const problem = await this.exitProblem();
      for (const id of this.pending.values()) {
        try {
          this.controller.enqueue({
            jsonrpc: "2.0",
            id,
            error: { code: -32603, message: problem.title, data: problem },
          } as AnyMessage);
        } catch {
          // reader gone
        }
      }
      this.pending.clear();
    }
    this.finish();
  }

  private async exitProblem(): Promise<ProblemDetails> {
    const problem: ProblemDetails = {
      type: "urn:acp-http-client:agent-ended",
      title: "Agent Gone",
      status: 502,
      detail: "the agent ended before answering",
      serverId: this.opts.serverId,
    };
    try {
      const listUrl = this.httpUrl.slice(0, this.httpUrl.lastIndexOf("/"));
      const res = await this.fetcher(listUrl, { headers: this.headers(), signal: AbortSignal.timeout(2000) });
      if (!res.ok) return problem;
      const body = (await res.json()) as { servers?: Array<Record<string, unknown>> };
      const me = body.servers?.find((s) => s.serverId === this.opts.serverId);
      if (!me) return { ...problem, status: 404, title: "Server Deleted", detail: "the serverId was deleted" };
      for (const k of ["agent", "exitCode", "signal", "exitReason"]) if (me[k] !== undefined) problem[k] = me[k];
      if (typeof me.exitCode === "number") problem.detail = `the agent exited with code ${me.exitCode}`;
    } catch {
      // the generic problem above
    }
    return problem;
  }
}

function defaultWebSocket(url: string, headers: Record<string, string>, token?: string): WebSocketLike {
  const WS = (globalThis as { WebSocket?: new (url: string, opts?: unknown) => WebSocketLike }).WebSocket;
  if (!WS) throw new Error("no WebSocket implementation: pass createWebSocket (or run Node >= 22)");
  if (Object.keys(headers).length === 0) return new WS(url);
  if (canSendHeaders()) return new WS(url, { headers });
  // A browser's WebSocket cannot send headers. The token goes in the URL as `access_token`, which
  // the daemon accepts on WebSocket upgrades only (a URL can end up in logs; the header is used
  // wherever it can be).
  const others = Object.keys(headers).filter((h) => h.toLowerCase() !== "authorization");
  if (others.length > 0) {
    throw new Error(`browsers cannot send headers on a WebSocket (${others.join(", ")}): use the SSE transport`);
  }
  if (!token) return new WS(url);
  const u = new URL(url);
  u.searchParams.set("access_token", token);
  return new WS(u.toString());
}

/** True in Node (and runtimes that copy its WebSocket API), whose WebSocket takes `{ headers }`. */
function canSendHeaders(): boolean {
  const p = (globalThis as { process?: { versions?: { node?: string } } }).process;
  return typeof p?.versions?.node === "string";
}

function toNetworkError(error: unknown): AcpHttpError {
  return new AcpHttpError({
    type: "urn:acp-http-client:network-error",
    title: "WebSocket connection failed (refused upgrade: unknown agent, token, Host or Origin?)",
    status: 0,
    detail: error instanceof Error ? error.message : String(error),
  });
}

