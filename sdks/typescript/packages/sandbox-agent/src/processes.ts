/**
 * The two long-lived faces of `/v1/processes`: following a process's output log over SSE
 * ({@link ProcessLogFollower}) and its terminal WebSocket ({@link ProcessTerminalSession}). The
 * plain request/response process calls are methods of `HostApi` (host.ts).
 *
 * Invariants: browser-safe (fetch, web streams, the WHATWG `WebSocket`; no Node module). A
 * follower never loses or repeats output silently: every entry's `sequence` is its byte offset, a
 * dropped stream is resumed with `Last-Event-ID` (the last offset delivered), and output the
 * daemon no longer holds is reported as a gap. Every wait is bounded (reconnect backoff, silence
 * on the stream, the time without a stream, one event's size).
 */
import { networkProblem, problemFromResponse } from "acp-http-client/errors";
import { parseSse } from "acp-http-client/sse";
import { HttpError } from "./errors.js";
import type { ProcessInfo, ProcessLogEntry, ProcessLogFollowQuery, ProcessLogGap } from "./types.js";

/** What the process helpers need of a `HostApi`: URLs, auth headers and its fetch. */
export interface ProcessContext {
  url(path: string, query?: Record<string, string | number | boolean | undefined>): URL;
  headers(): Record<string, string>;
  token?: string;
  fetcher: typeof fetch;
}

export type ProcessLogListener = (entry: ProcessLogEntry) => void;

export interface FollowProcessLogsOptions {
  /**
   * Output the daemon dropped before this reader got it (bytes `[from, to)`). Without it, gaps are
   * reported with `console.warn` — loss is never silent.
   */
  onGap?: (gap: ProcessLogGap) => void;
  /** First reconnect delay (default 100 ms); doubles up to `reconnectMaxMs` (default 5 s). */
  reconnectInitialMs?: number;
  reconnectMaxMs?: number;
  /** Give up (reject `closed`) after this long without an open stream (default 60 s). */
  reconnectTimeoutMs?: number;
  /** A stream silent for this long is dropped and resumed (default 45 s; the daemon pings every 15 s). */
  idleTimeoutMs?: number;
  /** Largest SSE event accepted (default 1 MiB; an entry holds at most 64 KiB of output). */
  maxEventBytes?: number;
  /** Aborting it is `close()`. */
  signal?: AbortSignal;
}

/** A running `followProcessLogs`. */
export interface ProcessLogSubscription {
  /** Stops following (the stream is aborted; `closed` resolves). */
  close(): void;
  /**
   * Resolves when the process has exited and every entry was delivered, or after `close()`;
   * rejects when following failed for good (the process was deleted, a 4xx, no stream for
   * `reconnectTimeoutMs`, a listener that threw).
   */
  readonly closed: Promise<void>;
  /** `sequence` of the last entry delivered (the offset a resume starts after), `null` before one. */
  readonly lastSequence: number | null;
  /** How many times re-opening the stream was attempted after a drop. */
  readonly reconnects: number;
}

/** Starts following; resolves once the first stream is open (its errors are thrown here). */
export async function followProcessLogs(
  ctx: ProcessContext,
  id: string,
  listener: ProcessLogListener,
  query: ProcessLogFollowQuery = {},
  options: FollowProcessLogsOptions = {},
): Promise<ProcessLogSubscription> {
  const follower = new ProcessLogFollower(ctx, id, listener, query, options);
  await follower.start();
  return follower;
}

class ProcessLogFollower implements ProcessLogSubscription {
  readonly closed: Promise<void>;
  lastSequence: number | null = null;
  reconnects = 0;
  private resolveClosed!: () => void;
  private rejectClosed!: (e: unknown) => void;
  private readonly abort = new AbortController();
  private readonly path: string;

  constructor(
    private readonly ctx: ProcessContext,
    private readonly id: string,
    private readonly listener: ProcessLogListener,
    private readonly query: ProcessLogFollowQuery,
    private readonly opts: FollowProcessLogsOptions,
  ) {
    this.path = `/v1/processes/${encodeURIComponent(id)}`;
    this.closed = new Promise((resolve, reject) => {
      this.resolveClosed = resolve;
      this.rejectClosed = reject;
    });
    // A caller that never awaits `closed` must not get an unhandled rejection.
    this.closed.catch(() => {});
    opts.signal?.addEventListener("abort", () => this.close(), { once: true });
  }

  close(): void {
    this.abort.abort();
    this.resolveClosed();
  }

  async start(): Promise<void> {
    if (this.opts.signal?.aborted) {
      this.close();
      return;
    }
    const attempt = new AbortController();
    let res: Response;
    try {
      res = await this.open(attempt);
      if (!res.ok) throw new HttpError(await problemFromResponse(res));
    } catch (error) {
      attempt.abort();
      this.abort.abort();
      this.rejectClosed(error);
      throw error;
    }
    void this.run(res, attempt);
  }

  /** One GET of the follow stream; `Last-Event-ID` once an entry was delivered. */
  private async open(attempt: AbortController): Promise<Response> {
    const headers: Record<string, string> = { ...this.ctx.headers(), Accept: "text/event-stream" };
    if (this.lastSequence !== null) headers["Last-Event-ID"] = String(this.lastSequence);
    const url = this.ctx.url(`${this.path}/logs`, { ...this.query, follow: true });
    const signal = anySignal([attempt.signal, this.abort.signal]);
    try {
      return await this.ctx.fetcher(url, { method: "GET", headers, signal });
    } catch (error) {
      throw new HttpError(networkProblem(error, url), { cause: error });
    }
  }

  private async run(first: Response, firstAttempt: AbortController): Promise<void> {
    const initial = this.opts.reconnectInitialMs ?? 100;
    const max = this.opts.reconnectMaxMs ?? 5000;
    const giveUpMs = this.opts.reconnectTimeoutMs ?? 60_000;
    let delay = initial;
    let res: Response | null = first;
    let attempt = firstAttempt;
    let lastOpen = Date.now();
    let lastError: unknown = null;
    try {
      for (;;) {
        if (this.abort.signal.aborted) return;
        if (res === null) {
          if (Date.now() - lastOpen > giveUpMs) {
            throw lastError ?? new HttpError(networkProblem(new Error("no log stream")));
          }
          this.reconnects++;
          await sleep(delay, this.abort.signal);
          if (this.abort.signal.aborted) return;
          delay = Math.min(delay * 2, max);
          attempt = new AbortController();
          try {
            res = await this.open(attempt);
          } catch (error) {
            lastError = error;
            continue;
          }
          if (!res.ok) {
            const problem = await problemFromResponse(res);
            lastError = new HttpError(problem);
            res = null;
            // 5xx, 408, 429: the daemon may come back; any other answer is final (404: deleted).
            if (problem.status >= 500 || problem.status === 408 || problem.status === 429) continue;
            throw lastError;
          }
        }
        lastOpen = Date.now();
        const ended = await this.read(res, attempt, () => {
          delay = initial; // the stream works: the next drop starts the backoff afresh
        });
        res = null;
        if (this.abort.signal.aborted) return;
        if (ended.error) {
          lastError = ended.error;
          if (ended.fatal) throw ended.error;
          continue;
        }
        // The daemon ends the stream when the process has exited and everything was sent (or at
        // shutdown). A proxy may also end it cleanly, so ask before believing it.
        if (await this.finished()) return;
      }
    } catch (error) {
      this.abort.abort();
      this.rejectClosed(error);
    } finally {
      attempt.abort();
      this.resolveClosed();
    }
  }

  /** Reads one stream to its end; never throws. `fatal` errors end the follower. */
  private async read(
    res: Response,
    attempt: AbortController,
    onEntry: () => void,
  ): Promise<{ error?: unknown; fatal?: boolean }> {
    if (!res.body) return { error: new Error("this fetch gives no streaming response body"), fatal: true };
    const idleMs = this.opts.idleTimeoutMs ?? 45_000;
    let idle: ReturnType<typeof setTimeout> | undefined;
    const touch = () => {
      clearTimeout(idle);
      idle = setTimeout(() => attempt.abort(new Error("log stream idle")), idleMs);
    };
    touch();
    try {
      for await (const ev of parseSse(res.body, this.opts.maxEventBytes ?? 1024 * 1024, touch)) {
        if (ev.event === "gap") {
          this.reportGap(ev.data);
          continue;
        }
        if (ev.event !== "log") continue;
        let entry: ProcessLogEntry;
        try {
          entry = JSON.parse(ev.data) as ProcessLogEntry;
        } catch {
          return { error: new Error(`log event ${ev.id ?? "?"} is not JSON`), fatal: true };
        }
        const seq = ev.id !== undefined && /^\d+$/.test(ev.id) ? Number(ev.id) : entry.sequence;
        try {
          this.listener(entry);
        } catch (error) {
          return { error, fatal: true };
        }
        this.lastSequence = seq;
        onEntry();
      }
      return {};
    } catch (error) {
      if (error instanceof Error && error.name === "SseEventTooLargeError") return { error, fatal: true };
      // A dropped or idle stream: resumed after the backoff.
      return { error: new HttpError(networkProblem(error)) };
    } finally {
      clearTimeout(idle);
      attempt.abort();
    }
  }

  /** After a clean end: true when the process has exited (so everything was sent) or is gone. */
  private async finished(): Promise<boolean> {
    try {
      const res = await this.ctx.fetcher(this.ctx.url(this.path), {
        headers: this.ctx.headers(),
        signal: this.abort.signal,
      });
      if (res.status === 404) return true;
      if (!res.ok) return false;
      return ((await res.json()) as ProcessInfo).status === "exited";
    } catch {
      return false;
    }
  }

  private reportGap(data: string) {
    let gap: ProcessLogGap;
    try {
      gap = JSON.parse(data) as ProcessLogGap;
    } catch {
      gap = { from: NaN, to: NaN };
    }
    if (this.opts.onGap) this.opts.onGap(gap);
    else console.warn(`sandbox-agent: output of ${this.id} bytes ${gap.from}..${gap.to} was dropped (gap)`);
  }
}

// ---------------------------------------------------------------------------------------------
// The terminal WebSocket.

/** Frames the daemon sends as text; output comes as binary frames. */
export interface ProcessTerminalReadyFrame {
  type: "ready";
  processId: string;
}
export interface ProcessTerminalExitFrame {
  type: "exit";
  exitCode?: number | null;
  /** The signal that ended the program (our addition to the published frame). */
  signal?: number | null;
}
export interface ProcessTerminalErrorFrame {
  type: "error";
  message: string;
}
export type ProcessTerminalServerFrame = ProcessTerminalReadyFrame | ProcessTerminalExitFrame | ProcessTerminalErrorFrame;
/** Frames the client sends (`sendInput`, `resize`, `close`). */
export type ProcessTerminalClientFrame =
  | { type: "input"; data: string; encoding?: "base64" }
  | { type: "resize"; cols: number; rows: number }
  | { type: "close" };

/** A WHATWG `WebSocket` constructor: the global one, or e.g. the `ws` package's. */
export type WebSocketConstructor = new (url: string, protocolsOrOptions?: unknown) => WebSocket;

export interface ProcessTerminalUrlOptions {
  /** Token to put in the URL (default: the client's). */
  accessToken?: string;
}

export interface ProcessTerminalConnectOptions extends ProcessTerminalUrlOptions {
  /**
   * WebSocket implementation. Default: the global `WebSocket` (browsers, Node >= 22), else the
   * `ws` package when it is installed (Node 20, which has no global one).
   */
  WebSocket?: WebSocketConstructor;
  /** Subprotocols (only where the token travels in the URL). */
  protocols?: string | string[];
  /**
   * How the token travels. `header` (`Authorization: Bearer`, `new WebSocket(url, { headers })` —
   * what Node's WebSocket and `ws` accept) is the default in Node; `query` (`?access_token=`) in
   * browsers, whose WebSocket cannot send headers. The daemon accepts the query form only on
   * WebSocket upgrades (docs/operations.md).
   */
  tokenIn?: "header" | "query";
}

/** True in Node (and runtimes that copy its WebSocket API), where a WebSocket can send headers. */
function canSendHeaders(): boolean {
  const p = (globalThis as { process?: { versions?: { node?: string } } }).process;
  return typeof p?.versions?.node === "string";
}

export function processTerminalUrl(ctx: ProcessContext, id: string, token: string | undefined): string {
  const url = ctx.url(`/v1/processes/${encodeURIComponent(id)}/terminal/ws`, { access_token: token });
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}

/**
 * Node 20 has no global WebSocket: take the `ws` package (an optional peer dependency) when it is
 * installed. Loaded through `process.getBuiltinModule` (Node >= 20.16) and `createRequire`, so no
 * Node module is imported statically and the file stays browser-safe (and bundlers leave it alone).
 */
function wsPackage(): WebSocketConstructor | undefined {
  const p = (globalThis as { process?: { getBuiltinModule?: (id: string) => unknown } }).process;
  const mod = p?.getBuiltinModule?.("node:module") as
    | { createRequire(from: string): (id: string) => unknown }
    | undefined;
  if (!mod) return undefined;
  try {
    const ws = mod.createRequire(import.meta.url)("ws") as WebSocketConstructor & { WebSocket?: WebSocketConstructor };
    return ws.WebSocket ?? ws;
  } catch {
    return undefined;
  }
}

export function openTerminalSocket(ctx: ProcessContext, id: string, options: ProcessTerminalConnectOptions): WebSocket {
  return openSocket(ctx, (token) => processTerminalUrl(ctx, id, token), options);
}

/** Opens a daemon WebSocket at `urlFor(token)`; the token goes in a header where the runtime can send one. */
export function openSocket(
  ctx: ProcessContext,
  urlFor: (token: string | undefined) => string,
  options: ProcessTerminalConnectOptions,
): WebSocket {
  const WS = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket ?? wsPackage();
  if (!WS) {
    throw new TypeError("no WebSocket implementation: pass options.WebSocket, install `ws` (Node 20) or run Node >= 22");
  }
  const token = options.accessToken ?? ctx.token;
  const mode = options.tokenIn ?? (canSendHeaders() ? "header" : "query");
  if (!token || mode === "query") {
    const url = urlFor(token);
    return options.protocols === undefined ? new WS(url) : new WS(url, options.protocols);
  }
  if (options.protocols !== undefined) {
    throw new TypeError("protocols can only be given with tokenIn: 'query'");
  }
  const headers = { ...ctx.headers(), Authorization: `Bearer ${token}` };
  return new WS(urlFor(undefined), { headers });
}

const OPEN = 1;
const CONNECTING = 0;
const CLOSED = 3;

/**
 * A process's terminal over its WebSocket: output in (`onData`), input, resize and close out;
 * `ready` and `exit` announced. Attach listeners right after creating it.
 */
export class ProcessTerminalSession {
  readonly socket: WebSocket;
  /** Resolves when the socket has closed. */
  readonly closed: Promise<void>;
  /** Resolves with the `ready` frame; rejects (with an `HttpError` when the daemon says why) if the socket closes first. */
  readonly ready: Promise<ProcessTerminalReadyFrame>;
  /** The `exit` frame once it came. */
  exitStatus: ProcessTerminalExitFrame | null = null;
  private readonly listeners = {
    ready: new Set<(f: ProcessTerminalReadyFrame) => void>(),
    data: new Set<(d: Uint8Array) => void>(),
    exit: new Set<(f: ProcessTerminalExitFrame) => void>(),
    error: new Set<(e: ProcessTerminalErrorFrame | Error) => void>(),
    close: new Set<() => void>(),
  };
  private closeSent = false;
  private isReady = false;

  /** `explain` is asked why a socket closed before `ready` (browsers hide a refused upgrade's answer). */
  constructor(socket: WebSocket, explain?: () => Promise<Error | null>) {
    this.socket = socket;
    socket.binaryType = "arraybuffer";
    let resolveReady!: (f: ProcessTerminalReadyFrame) => void;
    let rejectReady!: (e: unknown) => void;
    this.ready = new Promise((res, rej) => {
      resolveReady = res;
      rejectReady = rej;
    });
    this.ready.catch(() => {});
    this.onReady((f) => {
      this.isReady = true;
      resolveReady(f);
    });
    this.closed = new Promise((resolve) => {
      socket.addEventListener("close", () => {
        for (const l of this.listeners.close) l();
        if (this.isReady) return resolve();
        void (async () => {
          const why = (await explain?.().catch(() => null)) ?? null;
          rejectReady(why ?? new HttpError(networkProblem(new Error("the terminal WebSocket closed before `ready`"))));
          resolve();
        })();
      });
    });
    socket.addEventListener("message", (ev: MessageEvent) => this.handle(ev.data));
    socket.addEventListener("error", () => this.emitError(new Error("terminal WebSocket failed")));
  }

  onReady(listener: (frame: ProcessTerminalReadyFrame) => void): () => void {
    return this.add("ready", listener);
  }
  /** Terminal output, as raw bytes. */
  onData(listener: (data: Uint8Array) => void): () => void {
    return this.add("data", listener);
  }
  onExit(listener: (frame: ProcessTerminalExitFrame) => void): () => void {
    return this.add("exit", listener);
  }
  onError(listener: (error: ProcessTerminalErrorFrame | Error) => void): () => void {
    return this.add("error", listener);
  }
  onClose(listener: () => void): () => void {
    return this.add("close", listener);
  }

  /** Text is sent as is; bytes as base64. Dropped when the socket is not open. */
  sendInput(data: string | ArrayBuffer | ArrayBufferView): void {
    if (typeof data === "string") return this.send({ type: "input", data });
    const bytes =
      data instanceof ArrayBuffer ? new Uint8Array(data) : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    this.send({ type: "input", data: toBase64(bytes), encoding: "base64" });
  }

  resize(size: { cols: number; rows: number }): void {
    this.send({ type: "resize", cols: size.cols, rows: size.rows });
  }

  /** Says `close` to the daemon and closes the socket (the process keeps running). */
  close(): void {
    const state = this.socket.readyState;
    if (state === CONNECTING) {
      this.socket.addEventListener("open", () => this.close(), { once: true });
      return;
    }
    if (state === OPEN && !this.closeSent) {
      this.closeSent = true;
      this.send({ type: "close" });
    }
    if (state !== CLOSED) this.socket.close();
  }

  private add<K extends keyof ProcessTerminalSession["listeners"]>(
    kind: K,
    listener: Parameters<ProcessTerminalSession["listeners"][K]["add"]>[0],
  ): () => void {
    const set = this.listeners[kind] as Set<typeof listener>;
    set.add(listener);
    return () => void set.delete(listener);
  }

  private send(frame: ProcessTerminalClientFrame) {
    if (this.socket.readyState === OPEN) this.socket.send(JSON.stringify(frame));
  }

  private handle(data: unknown) {
    if (typeof data === "string") {
      let frame: ProcessTerminalServerFrame;
      try {
        frame = JSON.parse(data) as ProcessTerminalServerFrame;
      } catch {
        return this.emitError(new Error("the daemon sent a terminal control frame that is not JSON"));
      }
      if (frame.type === "ready") for (const l of this.listeners.ready) l(frame);
      else if (frame.type === "exit") {
        this.exitStatus = frame;
        for (const l of this.listeners.exit) l(frame);
      } else if (frame.type === "error") this.emitError(frame);
      else this.emitError(new Error(`unknown terminal frame type ${JSON.stringify((frame as { type?: unknown }).type)}`));
      return;
    }
    let bytes: Uint8Array;
    if (data instanceof ArrayBuffer) bytes = new Uint8Array(data);
    else if (ArrayBuffer.isView(data)) bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    else return this.emitError(new Error("the daemon sent a terminal frame of an unknown kind"));
    for (const l of this.listeners.data) l(bytes);
  }

  private emitError(e: ProcessTerminalErrorFrame | Error) {
    for (const l of this.listeners.error) l(e);
  }
}

/** Asks the daemon why a terminal socket could not open: the process's own problem, if any. */
export async function explainTerminalRefusal(ctx: ProcessContext, id: string): Promise<Error | null> {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 2000);
  try {
    const res = await ctx.fetcher(ctx.url(`/v1/processes/${encodeURIComponent(id)}`), {
      headers: ctx.headers(),
      signal: ac.signal,
    });
    if (!res.ok) return new HttpError(await problemFromResponse(res));
    const p = (await res.json()) as ProcessInfo;
    if (!p.tty) {
      return new HttpError({
        type: "about:blank",
        title: "Conflict",
        status: 409,
        detail: `${id} has no terminal (not started with tty)`,
      });
    }
    return null;
  } catch {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}

/** An AbortSignal that aborts when any of `signals` does. */
export function anySignal(signals: AbortSignal[]): AbortSignal {
  // AbortSignal.any (Node >= 20.3, current browsers) holds its sources weakly; the fallback is
  // for older runtimes and leaves one listener per call on the sources.
  const any = (AbortSignal as { any?: (s: AbortSignal[]) => AbortSignal }).any;
  if (any) return any(signals);
  const ac = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      ac.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => ac.abort(s.reason), { once: true });
  }
  return ac.signal;
}
