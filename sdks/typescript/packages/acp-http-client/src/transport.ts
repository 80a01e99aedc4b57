/**
 * The ACP-over-HTTP transport for one `serverId` (`/v1/acp/{serverId}`), shaped as the official ACP
 * SDK's `Stream` (a readable and a writable of JSON-RPC messages).
 *
 * Outgoing: each message is one POST. A request's answer comes back in the POST body (200) and is
 * pushed to the readable; a problem answer (non-2xx) or a failed fetch becomes a JSON-RPC error
 * response for that id whose `data` is the problem body, so only that call fails, never the whole
 * connection. Notifications and responses are awaited (202) so they reach the agent in order.
 *
 * Incoming: one SSE reader (started once the first POST has created the instance) for everything
 * else. It resumes with `Last-Event-ID` after a dropped stream, with exponential backoff; a `gap`
 * event is handed to `onGap` (never swallowed); 410 means the agent is gone and ends the readable
 * once every POST in flight has been answered (so those POSTs still see their own 502).
 *
 * Invariants: no Node-only API (fetch and web streams only); every wait is bounded (DELETE on close
 * by `closeTimeoutMs`, a silent stream by `idleTimeoutMs`, an event's size by `maxEventBytes`).
 */
import type { AnyMessage } from "@agentclientprotocol/sdk";
import {
  AcpHttpError,
  AcpTransportClosedError,
  networkProblem,
  problemFromResponse,
  type ProblemDetails,
} from "./errors.js";
import { parseSse } from "./sse.js";
import { AcpStreamBase, idKey } from "./stream-base.js";
import { activeTraceHeaders, loadOpenTelemetry } from "./trace.js";

/** `data` of a `gap` event: the ids `from..=to` were evicted before this client read them. */
export interface GapEvent {
  from: number;
  to: number;
}

export type EnvelopeDirection = "inbound" | "outbound";

export interface AcpHttpTransportOptions {
  /** Base URL of the server, e.g. `http://127.0.0.1:2468`. */
  baseUrl: string;
  /** The client-chosen instance name (1–128 of `[A-Za-z0-9._-]`). */
  serverId: string;
  /** Agent to start on the first POST (`?agent=`). Omit to attach to an existing serverId. */
  agent?: string;
  /** Bearer token. */
  token?: string;
  /** `fetch` to use (defaults to the global one). */
  fetch?: typeof fetch;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /** Path prefix of the endpoint (default `/v1/acp`). */
  path?: string;
  /** Resume the event stream after this id (e.g. a stored `lastEventId` after a restart). */
  lastEventId?: number;
  /** Called for each `gap` event. Without it the gap is reported with `console.warn`. */
  onGap?: (gap: GapEvent) => void;
  /** Observes every envelope sent or received. */
  onEnvelope?: (envelope: AnyMessage, direction: EnvelopeDirection) => void;
  /** Errors that concern no call: a notification POST that failed, a stream that broke for good. */
  onError?: (error: Error) => void;
  /** First reconnect delay (default 100 ms); doubles up to `reconnectMaxMs` (default 5 s). */
  reconnectInitialMs?: number;
  reconnectMaxMs?: number;
  /** How long `close()` waits for the DELETE (default 2 s). */
  closeTimeoutMs?: number;
  /** A stream silent for this long is dropped and resumed (default 45 s; the server pings every 15 s). */
  idleTimeoutMs?: number;
  /** Largest accepted event (default 64 MiB). */
  maxEventBytes?: number;
}

type JsonRpcId = string | number;

/** What both transports (SSE and WebSocket) offer besides the ACP stream itself. */
export interface AcpStreamTransport {
  readonly readable: ReadableStream<AnyMessage>;
  readonly writable: WritableStream<AnyMessage>;
  readonly lastEventId: number | null;
  /**
   * The event id the latest POST answer named (`Sandbox-Agent-Last-Event-Id`: every update the
   * agent wrote before that answer is on the stream at or below it; never lower than an earlier
   * answer's); `null` before any answer, or when the latest answer named none (a daemon that does
   * not send it). Only the HTTP transport has it (over a WebSocket an answer follows its updates
   * on the same socket).
   */
  readonly answeredEventId?: number | null;
  readonly reconnects: number;
  readonly isClosed: boolean;
  readonly endReason: AcpHttpError | null;
  waitForEventId(id: number, timeoutMs?: number): Promise<boolean>;
  close(): Promise<void>;
  detach(): Promise<void>;
}

const FAILED_IDS_MAX = 1024;

export class AcpHttpTransport extends AcpStreamBase {
  private readonly opts: AcpHttpTransportOptions;
  private readonly inflight = new Set<Promise<void>>();
  /** Ids whose call already failed locally; a late answer for them on the stream is dropped. */
  private readonly failedIds = new Set<string>();
  private readonly postAbort = new AbortController();
  private sseAbort: AbortController | null = null;
  private sseStarted = false;
  private bootstrapped = false;
  private answeredId: number | null = null;

  constructor(options: AcpHttpTransportOptions) {
    if (!(options.fetch ?? globalThis.fetch)) throw new Error("no fetch implementation available; pass `fetch`");
    super(options);
    this.opts = options;
  }

  /** See `AcpStreamTransport.answeredEventId`. */
  get answeredEventId(): number | null {
    return this.answeredId;
  }

  protected async closeImpl(deleteServer: boolean): Promise<void> {
    this.sseAbort?.abort();
    this.postAbort.abort();
    if (this.bootstrapped && deleteServer) {
      try {
        const res = await this.fetcher(this.httpUrl, {
          method: "DELETE",
          headers: this.headers({}),
          signal: AbortSignal.timeout(this.opts.closeTimeoutMs ?? 2000),
        });
        await res.body?.cancel().catch(() => {});
      } catch {
        // The server stops the agent in the background anyway; a slow or failed DELETE must not
        // hold the caller (the bound is the point).
      }
    }
    this.finish();
  }

  private headers(extra: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { ...this.opts.headers, ...extra };
    if (this.opts.token) h.Authorization = `Bearer ${this.opts.token}`;
    return h;
  }

  protected async send(message: AnyMessage): Promise<void> {
    if (this.isClosed) throw new AcpTransportClosedError();
    this.opts.onEnvelope?.(message, "outbound");
    const m = message as Record<string, unknown>;
    const isRequest = typeof m.method === "string" && m.id !== undefined && m.id !== null;
    // The caller's trace context (OpenTelemetry, when the application uses it) for a request:
    // taken here, where the caller's context is still the active one.
    let trace: Record<string, string> = {};
    if (isRequest) {
      await loadOpenTelemetry();
      trace = activeTraceHeaders();
    }
    const post = this.post(message, isRequest ? (m.id as JsonRpcId) : null, trace);
    if (isRequest) {
      // Requests may take minutes (prompts): the writer must not wait for the answer.
      this.inflight.add(post);
      void post.finally(() => this.inflight.delete(post));
      return;
    }
    // Notifications and responses: awaited, so they reach the agent in the order they were written.
    await post;
  }

  private async post(
    message: AnyMessage,
    requestId: JsonRpcId | null,
    trace: Record<string, string> = {},
  ): Promise<void> {
    let url = this.httpUrl;
    if (!this.bootstrapped && this.opts.agent) url += `?agent=${encodeURIComponent(this.opts.agent)}`;
    let problem: ProblemDetails | null = null;
    try {
      const res = await this.fetcher(url, {
        method: "POST",
        headers: this.headers({ ...trace, "Content-Type": "application/json", Accept: "application/json" }),
        body: JSON.stringify(message),
        signal: this.postAbort.signal,
      });
      if (res.ok) {
        this.markBootstrapped();
        if (res.status === 200) {
          // Recorded before the answer is handed on, so that whoever awaits it can wait for the
          // updates that preceded it. Never lowered (answers on separate connections can arrive
          // out of order); an answer without it (a daemon that does not send it, or an error the
          // daemon made) clears it, so that nobody waits for a stale id.
          const named = Number.parseInt(res.headers.get("sandbox-agent-last-event-id") ?? "", 10);
          this.answeredId =
            Number.isSafeInteger(named) && named >= 0 ? Math.max(named, this.answeredId ?? 0) : null;
          const text = await res.text();
          if (text.trim()) this.push(JSON.parse(text) as AnyMessage, "post");
        } else {
          await res.body?.cancel().catch(() => {});
        }
        return;
      }
      problem = await problemFromResponse(res);
    } catch (error) {
      if (this.postAbort.signal.aborted) return; // closed: the connection fails its calls itself
      problem = networkProblem(error, url);
    }
    if (requestId === null) {
      this.opts.onError?.(new AcpHttpError(problem));
      return;
    }
    this.remember(requestId);
    this.push(
      {
        jsonrpc: "2.0",
        id: requestId,
        error: { code: -32603, message: problem.title, data: problem },
      } as AnyMessage,
      "post",
    );
  }

  private remember(id: JsonRpcId) {
    this.failedIds.add(idKey(id));
    if (this.failedIds.size > FAILED_IDS_MAX) {
      const oldest = this.failedIds.values().next().value;
      if (oldest !== undefined) this.failedIds.delete(oldest);
    }
  }

  private markBootstrapped() {
    this.bootstrapped = true;
    if (!this.sseStarted && !this.isClosed) {
      this.sseStarted = true;
      void this.sseLoop();
    }
  }

  private push(message: AnyMessage, from: "post" | "sse") {
    if (this.ended) return;
    const m = message as Record<string, unknown>;
    if (from === "sse" && m.method === undefined && m.id !== undefined && m.id !== null) {
      // A late answer (after a 504 or a lost POST) to a call that already failed here: the
      // connection would report it as unknown; it has been answered already.
      if (this.failedIds.delete(idKey(m.id as JsonRpcId))) return;
    }
    this.opts.onEnvelope?.(message, "inbound");
    try {
      this.controller.enqueue(message);
    } catch {
      // The reader went away (connection closed); nothing left to deliver to.
    }
  }

  private async sseLoop(): Promise<void> {
    const initial = this.opts.reconnectInitialMs ?? 100;
    const max = this.opts.reconnectMaxMs ?? 5000;
    const idleMs = this.opts.idleTimeoutMs ?? 45_000;
    const maxEvent = this.opts.maxEventBytes ?? 64 * 1024 * 1024;
    let delay = initial;
    let first = true;
    while (!this.isClosed) {
      if (!first) {
        this.reconnectCount++;
        await sleep(delay, this.postAbort.signal);
        if (this.isClosed) return;
        delay = Math.min(delay * 2, max);
      }
      first = false;
      const abort = new AbortController();
      this.sseAbort = abort;
      const headers = this.headers({ Accept: "text/event-stream" });
      if (this.lastId !== null) headers["Last-Event-ID"] = String(this.lastId);
      let idle: ReturnType<typeof setTimeout> | undefined;
      const touch = () => {
        clearTimeout(idle);
        idle = setTimeout(() => abort.abort(new Error("event stream idle")), idleMs);
      };
      try {
        touch();
        const res = await this.fetcher(this.httpUrl, { method: "GET", headers, signal: abort.signal });
        if (!res.ok) {
          const problem = await problemFromResponse(res);
          if (res.status === 410 || res.status === 404) {
            // 410: the agent is gone and everything was delivered. 404: the serverId was deleted.
            this.endError = new AcpHttpError(problem);
            await this.endAfterInflight();
            return;
          }
          if (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429) {
            this.fail(new AcpHttpError(problem));
            return;
          }
          continue; // 5xx, 408, 429: retry with backoff
        }
        if (!res.body) {
          this.fail(new Error("this fetch gives no streaming response body"));
          return;
        }
        for await (const ev of parseSse(res.body, maxEvent, touch)) {
          if (ev.event === "gap") {
            this.reportGap(ev.data);
            continue;
          }
          if (ev.event !== "message") continue;
          if (ev.id !== undefined && /^\d+$/.test(ev.id)) this.lastId = Number(ev.id);
          delay = initial; // the stream works: the next drop starts the backoff afresh
          let parsed: unknown;
          try {
            parsed = JSON.parse(ev.data);
          } catch {
            this.opts.onError?.(new Error(`event ${ev.id ?? "?"} is not JSON; skipped`));
            continue;
          }
          this.push(parsed as AnyMessage, "sse");
          this.wakeIdWaiters();
        }
      } catch (error) {
        if (this.isClosed) return;
        if (error instanceof Error && error.name === "SseEventTooLargeError") {
          this.fail(error);
          return;
        }
        // A dropped or idle stream: resume with Last-Event-ID after the backoff.
      } finally {
        clearTimeout(idle);
        abort.abort();
      }
    }
  }

  private reportGap(data: string) {
    let gap: GapEvent;
    try {
      gap = JSON.parse(data) as GapEvent;
    } catch {
      gap = { from: NaN, to: NaN };
    }
    if (this.opts.onGap) this.opts.onGap(gap);
    else console.warn(`acp-http-client: events ${gap.from}..${gap.to} were lost (gap)`);
  }

  private async endAfterInflight() {
    // POSTs still waiting will each get their own answer (502 with the exit details) very soon;
    // closing the readable first would replace those with a generic "connection closed".
    if (this.inflight.size > 0 && !this.closing) {
      const bound = new AbortController();
      await Promise.race([Promise.allSettled([...this.inflight]), sleep(5000, bound.signal)]);
      bound.abort();
    }
    this.finish();
  }

  protected override fail(error: Error) {
    if (!this.ended) this.postAbort.abort();
    super.fail(error);
  }
}

/** Resolves after `ms`, or at once when `signal` aborts (internal; not in the package's index). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
  });
}
