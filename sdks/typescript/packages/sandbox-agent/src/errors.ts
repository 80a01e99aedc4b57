/**
 * The errors of the `sandbox-agent` SDK.
 *
 * Invariant: callers see only these classes (plus `TypeError`s for bad arguments): HTTP problems
 * as {@link HttpError}, the connection gates, a missing agent capability, and the agent's own errors.
 */
import { AcpHttpError, type ProblemDetails } from "acp-http-client/errors";

/** A non-2xx answer of the daemon (or a failed fetch, `status` 0), with its problem body. */
export class HttpError extends AcpHttpError {
  constructor(problem: ProblemDetails, options?: { cause?: unknown }) {
    super(problem, options);
    this.name = "HttpError";
  }
}

/** A session call before `connect()` or after `disconnect()`. */
export class NotConnectedError extends Error {
  constructor(message = "not connected: call connect() first") {
    super(message);
    this.name = "NotConnectedError";
  }
}

/** `connect()` while already connected (or connecting): one connection per client. */
export class AlreadyConnectedError extends Error {
  constructor(message = "already connected: call disconnect() first") {
    super(message);
    this.name = "AlreadyConnectedError";
  }
}

/** The agent does not offer this call (capability not advertised, or method not found). */
export class UnsupportedError extends Error {
  readonly method: string;
  readonly agent: string;
  constructor(agent: string, method: string, why: string) {
    super(`agent "${agent}" does not support ${method}: ${why}`);
    this.name = "UnsupportedError";
    this.agent = agent;
    this.method = method;
  }
}

/** An error the agent answered (a JSON-RPC error object). */
export class AgentError extends Error {
  readonly code: number;
  readonly data?: unknown;
  constructor(code: number, message: string, data?: unknown) {
    super(message);
    this.name = "AgentError";
    this.code = code;
    this.data = data;
  }
}

/**
 * `onPermissionRequest` returned something that is no answer (or an option the agent did not
 * offer). Given to `onError` (else logged with `console.error`); the agent gets a JSON-RPC error.
 */
export class PermissionReplyError extends Error {
  readonly reply: unknown;
  constructor(reply: unknown, why: string) {
    let shown: string;
    try {
      shown = JSON.stringify(reply) ?? String(reply);
    } catch {
      shown = String(reply);
    }
    super(`onPermissionRequest returned ${shown}: ${why}`);
    this.name = "PermissionReplyError";
    this.reply = reply;
  }
}
