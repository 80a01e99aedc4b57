/**
 * What the SSE and the WebSocket transports share: the readable/writable pair of the ACP `Stream`,
 * the instance URL, the last event id and its waiters, the reconnect count, how the stream ends
 * (`finish`, `fail`) and the `close`/`detach` entry points. Each transport adds only how messages
 * travel (`send`) and how it shuts down (`closeImpl`).
 */
import type { AnyMessage } from "@agentclientprotocol/sdk";
import type { AcpHttpError } from "./errors.js";
import type { AcpHttpTransportOptions, AcpStreamTransport } from "./transport.js";

export abstract class AcpStreamBase implements AcpStreamTransport {
  readonly readable: ReadableStream<AnyMessage>;
  readonly writable: WritableStream<AnyMessage>;

  /** `{baseUrl}{path}/{serverId}`: the instance's HTTP URL. */
  protected readonly httpUrl: string;
  protected readonly fetcher: typeof fetch;
  protected controller!: ReadableStreamDefaultController<AnyMessage>;
  protected ended = false;
  protected closing: Promise<void> | null = null;
  protected lastId: number | null;
  protected reconnectCount = 0;
  protected endError: AcpHttpError | null = null;
  private readonly idWaiters = new Set<() => void>();
  private readonly onError?: (error: Error) => void;

  protected constructor(options: AcpHttpTransportOptions) {
    this.fetcher = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.onError = options.onError;
    const base = options.baseUrl.replace(/\/+$/, "");
    const path = (options.path ?? "/v1/acp").replace(/\/+$/, "");
    this.httpUrl = `${base}${path}/${encodeURIComponent(options.serverId)}`;
    this.lastId = options.lastEventId ?? null;
    this.readable = new ReadableStream<AnyMessage>({
      start: (c) => {
        this.controller = c;
      },
      cancel: () => this.close(),
    });
    this.writable = new WritableStream<AnyMessage>({
      write: (message) => this.send(message),
      close: () => this.close(),
      abort: () => this.close(),
    });
  }

  /** Sends one message (the writable's `write`). */
  protected abstract send(message: AnyMessage): Promise<void>;
  /** Stops the transport; DELETEs the serverId when `deleteServer`. */
  protected abstract closeImpl(deleteServer: boolean): Promise<void>;
  /** The id of the last event read from the stream (`null` before any). */
  get lastEventId(): number | null {
    return this.lastId;
  }

  /** How many times the event stream was re-opened after it dropped. */
  get reconnects(): number {
    return this.reconnectCount;
  }

  /** True once the transport was closed or the server ended it. */
  get isClosed(): boolean {
    return this.ended || this.closing !== null;
  }

  /** Why the server ended the stream (the 410/404 problem), if it did. */
  get endReason(): AcpHttpError | null {
    return this.endError;
  }

  /**
   * Resolves once the event with id `id` (or a later one) was read, the stream ended, or `timeoutMs`
   * passed — whichever is first. Returns whether the id was reached.
   */
  waitForEventId(id: number, timeoutMs = 5000): Promise<boolean> {
    const reached = () => this.lastId !== null && this.lastId >= id;
    if (reached()) return Promise.resolve(true);
    if (this.ended) return Promise.resolve(false);
    return new Promise((resolve) => {
      const check = () => {
        if (reached() || this.ended) done();
      };
      const timer = setTimeout(() => done(), timeoutMs);
      const done = () => {
        clearTimeout(timer);
        this.idWaiters.delete(check);
        resolve(reached());
      };
      this.idWaiters.add(check);
    });
  }

  /** Closes: stops the stream, fails calls in flight, and DELETEs the serverId (bounded wait). */
  close(): Promise<void> {
    if (!this.closing) this.closing = this.closeImpl(true);
    return this.closing;
  }

  /**
   * Closes this client only: the stream stops and calls in flight fail, but the serverId is not
   * DELETEd, so its agent keeps running and another client may attach to it (with `lastEventId`).
   */
  detach(): Promise<void> {
    if (!this.closing) this.closing = this.closeImpl(false);
    return this.closing;
  }

  /** Tells every `waitForEventId` to look again (an id was read, or the stream ended). */
  protected wakeIdWaiters(): void {
    for (const w of [...this.idWaiters]) w();
  }

  /** Ends the readable with `error` (reported to `onError` too); once. */
  protected fail(error: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.onError?.(error);
    try {
      this.controller.error(error);
    } catch {
      // already closed
    }
    this.wakeIdWaiters();
  }

  /** Ends the readable normally; once. */
  protected finish(): void {
    if (this.ended) return;
    this.ended = true;
    try {
      this.controller.close();
    } catch {
      // already closed or errored
    }
    this.wakeIdWaiters();
  }
}

/** A JSON-RPC id as a map key that keeps `1` and `"1"` apart. */
export function idKey(id: string | number): string {
  return typeof id === "number" ? `n:${id}` : `s:${id}`;
}
