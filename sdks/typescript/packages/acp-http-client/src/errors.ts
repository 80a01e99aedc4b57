/**
 * Errors of the ACP HTTP transport.
 *
 * Invariant: every HTTP answer that is not 2xx becomes an {@link AcpHttpError} carrying the RFC 9457
 * problem body the server sent (or a synthesized one when the body was not a problem), so callers
 * can read `status`, `exitCode`, `stderrTail`, … without parsing anything themselves.
 */

/** An RFC 9457 problem body; servers add members such as `exitCode` or `serverId`. */
export interface ProblemDetails {
  type: string;
  title: string;
  status: number;
  detail?: string;
  instance?: string;
  [member: string]: unknown;
}

/** `type` of the problem synthesized when no HTTP answer arrived at all (`status` is 0). */
export const NETWORK_ERROR_TYPE = "urn:acp-http-client:network-error";

/** An HTTP problem answer (or a failed fetch, `status` 0) as a typed error. */
export class AcpHttpError extends Error {
  readonly status: number;
  readonly title: string;
  readonly detail?: string;
  readonly type: string;
  /** Exit code of the agent process, when the server reports that it ended. */
  readonly exitCode?: number | null;
  /** Signal that ended the agent process, when the server reports it. */
  readonly signal?: string | number | null;
  /** Why the agent ended (`exited`, `crashed`, `oom`, `graceful`, `forced`). */
  readonly exitReason?: string | null;
  /** The last lines of the agent's stderr, when the server reports them. */
  readonly stderrTail?: string | null;
  /** The whole problem body. */
  readonly problem: ProblemDetails;

  /**
   * `cause`: what made it, for a failed fetch the network error itself (its own `cause` names
   * the system error, e.g. `ECONNREFUSED`).
   */
  constructor(problem: ProblemDetails, options?: { cause?: unknown }) {
    super(
      problem.detail ? `${problem.title}: ${problem.detail}` : problem.title,
      options?.cause !== undefined ? { cause: options.cause } : undefined,
    );
    this.name = "AcpHttpError";
    this.problem = problem;
    this.status = problem.status;
    this.title = problem.title;
    this.detail = problem.detail;
    this.type = problem.type;
    this.exitCode = optional<number>(problem.exitCode, "number");
    this.signal = optional<string | number>(problem.signal, "string", "number");
    this.exitReason = optional<string>(problem.exitReason, "string");
    this.stderrTail = optional<string>(problem.stderrTail, "string");
  }
}

/** Raised on writes to a transport that was closed (by `close()` or because the server ended it). */
export class AcpTransportClosedError extends Error {
  constructor(message = "ACP HTTP transport is closed") {
    super(message);
    this.name = "AcpTransportClosedError";
  }
}

function optional<T>(value: unknown, ...types: string[]): T | null | undefined {
  if (value === null) return null;
  return types.includes(typeof value) ? (value as T) : undefined;
}

/** True when `value` has the members every problem body has. */
export function isProblemDetails(value: unknown): value is ProblemDetails {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const v = value as Record<string, unknown>;
  return typeof v.status === "number" && typeof v.title === "string" && typeof v.type === "string";
}

/**
 * Reads a non-2xx response into a problem. A body that is not a problem (a proxy's HTML page, say)
 * still gives a problem with the status and status text, so no answer is ever untyped.
 */
export async function problemFromResponse(response: Response): Promise<ProblemDetails> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // The body could not be read; the status alone still says what happened.
  }
  if (text) {
    try {
      const parsed: unknown = JSON.parse(text);
      if (isProblemDetails(parsed)) return parsed;
    } catch {
      // Not JSON: fall through to the synthesized problem.
    }
  }
  return {
    type: "about:blank",
    title: response.statusText || `HTTP ${response.status}`,
    status: response.status,
    ...(text ? { detail: text.slice(0, 1024) } : {}),
  };
}

/**
 * The problem that stands for a fetch that failed without an HTTP answer: `detail` names the URL
 * and the cause (fetch says only "fetch failed"; the reason, such as `connect ECONNREFUSED
 * 127.0.0.1:2468`, is in its `cause`), and the problem carries `url`.
 */
export function networkProblem(error: unknown, url?: string | URL): ProblemDetails {
  const message = error instanceof Error ? error.message : String(error);
  const reasons: string[] = [];
  let cause: unknown = error instanceof Error ? error.cause : undefined;
  for (let depth = 0; cause !== undefined && cause !== null && depth < 4; depth++) {
    const c = cause as { message?: unknown; code?: unknown; cause?: unknown };
    const text = typeof c.message === "string" && c.message ? c.message : typeof c.code === "string" ? c.code : String(cause);
    if (!reasons.includes(text) && text !== message) reasons.push(text);
    cause = c.cause;
  }
  const where = url === undefined ? "" : `${redact(String(url))}: `;
  return {
    type: NETWORK_ERROR_TYPE,
    title: "Network error",
    status: 0,
    detail: `${where}${message}${reasons.length ? ` (${reasons.join("; ")})` : ""}`,
    ...(url === undefined ? {} : { url: redact(String(url)) }),
  };
}

/** A URL without an `access_token` query value (never put a token in an error). */
function redact(url: string): string {
  return url.replace(/([?&]access_token=)[^&#]*/g, "$1<redacted>");
}

/**
 * Maps a JSON-RPC error that carries an HTTP problem in `data` (made by our transport for a failed
 * POST, or by a server running with `jsonrpc-errors`) to {@link AcpHttpError}; anything else is
 * returned unchanged. Duck-typed, so this module needs no ACP SDK at run time.
 */
export function toAcpError(error: unknown): unknown {
  if (error instanceof AcpHttpError) return error;
  if (typeof error === "object" && error !== null && typeof (error as { code?: unknown }).code === "number") {
    const data = (error as { data?: unknown }).data;
    if (isProblemDetails(data)) return new AcpHttpError(data);
  }
  return error;
}
