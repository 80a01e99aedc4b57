/**
 * Following `GET /v1/fs/watch` as an async iterator: every change beneath a directory as it
 * happens, across dropped connections.
 *
 * Invariant: the caller is never left with a silent gap. The first item is always
 * `{ kind: "rescan", reason: "start" }`, yielded once the daemon's watches are installed; and
 * whenever changes may have been missed — the daemon said `overflow`, or the connection dropped and
 * was made again — the iterator yields `{ kind: "rescan" }` at the point where the feed is live
 * again. Either way: every change after it is reported, and a listing made after receiving it sees
 * at least everything that happened before it. The caller "rescans" by re-reading what it mirrors
 * (e.g. `listEntries`), then applies the changes that follow.
 */
import { networkProblem, problemFromResponse, type ProblemDetails } from "acp-http-client/errors";
import { parseSse } from "acp-http-client/sse";
import { HttpError } from "./errors.js";
import { anySignal, type ProcessContext } from "./processes.js";
import type { WatchChange } from "./types.js";

export interface WatchOptions {
  /** Also every directory beneath (default false: the directory's own entries). */
  recursive?: boolean;
  /** Globs to leave out, e.g. `[".git", "node_modules"]` (see docs/files.md). */
  ignore?: string[];
  /** Ends the iteration (it returns; nothing is thrown). */
  signal?: AbortSignal;
  /** Longest wait between two reconnection attempts (default 5000 ms). */
  maxReconnectDelayMs?: number;
}

/** Changes may have been missed before this point: re-read what you mirror. */
export interface WatchRescan {
  kind: "rescan";
  /**
   * `start`: the feed is live (the first item); `overflow`: the daemon dropped changes (`cause`:
   * kernel, reader or scan); `reconnect`: the connection was lost and made again.
   */
  reason: "start" | "overflow" | "reconnect";
  cause?: string;
}

export type WatchItem = WatchChange | WatchRescan;

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * The first connection's refusal (404, 403, 400, 503 …) is thrown as an {@link HttpError}; later
 * ones only when they cannot pass by waiting (a 4xx); an `event: error` (a watch limit) is thrown
 * too. The watched directory's own removal is yielded, then the iteration ends.
 */
export async function* watchFs(ctx: ProcessContext, path: string, options: WatchOptions = {}): AsyncGenerator<WatchItem> {
  const { signal } = options;
  const maxDelay = options.maxReconnectDelayMs ?? 5000;
  const url = ctx.url("/v1/fs/watch", { path, recursive: options.recursive ?? false });
  if (options.ignore?.length) url.searchParams.set("ignore", options.ignore.join(","));
  let connected = false;
  let delay = 100;
  while (!signal?.aborted) {
    const attempt = new AbortController();
    const both = signal ? anySignal([attempt.signal, signal]) : attempt.signal;
    try {
      let res: Response;
      try {
        res = await ctx.fetcher(url, { headers: { ...ctx.headers(), Accept: "text/event-stream" }, signal: both });
      } catch (error) {
        if (signal?.aborted) return;
        if (!connected) throw new HttpError(networkProblem(error));
        res = undefined as unknown as Response;
      }
      if (res && !res.ok) {
        const problem = await problemFromResponse(res);
        if (!connected || (res.status >= 400 && res.status < 500)) throw new HttpError(problem);
        const retry = Number(res.headers.get("retry-after"));
        if (retry > 0) delay = Math.max(delay, retry * 1000);
      } else if (res?.body) {
        let root: string | undefined;
        try {
          for await (const ev of parseSse(res.body, 1 << 20)) {
            if (ev.event === "ready") {
              root = (JSON.parse(ev.data) as { path: string }).path;
              yield { kind: "rescan", reason: connected ? "reconnect" : "start" };
              connected = true;
              delay = 100;
            } else if (ev.event === "change") {
              const change = JSON.parse(ev.data) as WatchChange;
              yield change;
              if (change.kind === "remove" && change.path === root) return;
            } else if (ev.event === "overflow") {
              const cause = (JSON.parse(ev.data) as { reason?: string }).reason;
              yield { kind: "rescan", reason: "overflow", cause };
            } else if (ev.event === "error") {
              throw new HttpError(JSON.parse(ev.data) as ProblemDetails);
            }
          }
        } catch (error) {
          if (error instanceof HttpError || signal?.aborted) {
            if (signal?.aborted) return;
            throw error;
          }
          // A dropped connection: made again below.
        }
      }
    } finally {
      attempt.abort();
    }
    if (signal?.aborted) return;
    await sleep(delay, signal);
    delay = Math.min(delay * 2, maxDelay);
  }
}
