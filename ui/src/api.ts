// The daemon's REST surface as the page uses it (agents, instances, files, OpenCode sessions) —
// the SDK's `HostApi` from the `sandbox-agent` package, plus the calls it lacks — and the bearer
// token.
// Invariant: every API call goes through `api()`, whose client carries the token kept in
// sessionStorage (never localStorage: it is gone when the tab closes); any non-2xx answer is an
// `HttpError` carrying the problem+json body.

import { HostApi, HttpError } from "sandbox-agent";
import type { AgentInfo, FsEntry, InstanceInfo } from "sandbox-agent";

export { HttpError as ApiError };
export type { AgentInfo, FsEntry };

/** What the page reads from `GET /v1/acp`; `stderrTail` is used if a daemon ever lists it. */
export type Instance = InstanceInfo & { stderrTail?: string | null };

/** What the page reads of an OpenCode session (`GET /opencode/session`). */
export interface OpenCodeSession {
  id: string;
  title: string;
  /** The ACP instance behind it, and its ACP session once it prompted. */
  acpServerId: string;
  acpSessionId?: string;
  providerID?: string;
  modelID?: string;
  time: { created: number; updated: number };
}

const TOKEN_KEY = "sandbox-agent.token";

export function getToken(): string {
  try {
    return sessionStorage.getItem(TOKEN_KEY) ?? "";
  } catch {
    return "";
  }
}

/** The daemon's own origin: the page is served by it, so API calls are same-origin. */
export const baseUrl = location.origin;

class InspectorApi extends HostApi {
  /** `DELETE /v1/acp/{serverId}`: stops the instance (204 at once; the stop runs in the background). */
  async stopInstance(serverId: string): Promise<void> {
    const res = await this.send("DELETE", `/v1/acp/${encodeURIComponent(serverId)}`);
    await res.body?.cancel();
  }

  /**
   * The exit details (problem body: `exitCode`, `exitReason`, `stderrTail`, …) of an exited
   * instance. Any request to it is answered with them; `Prefer: jsonrpc-errors` makes that a
   * JSON-RPC error in a 200 rather than a 502 (the agent is gone, so nothing receives the request).
   */
  async exitDetails(serverId: string): Promise<Record<string, unknown>> {
    const body = await this.json<{ error?: { data?: Record<string, unknown> } }>("POST", `/v1/acp/${encodeURIComponent(serverId)}`, {
      body: { jsonrpc: "2.0", id: "inspector-exit-details", method: "_inspector/exit_details", params: {} },
      headers: { Accept: "application/json", Prefer: "jsonrpc-errors" },
    });
    return body.error?.data ?? {};
  }

  /** The OpenCode sessions of the daemon's `/opencode` bridge (it takes the bearer token too). */
  async openCodeSessions(): Promise<OpenCodeSession[]> {
    return this.json<OpenCodeSession[]>("GET", "/opencode/session");
  }

  /** The first `limit` bytes of a file as text, or a note saying it is binary or cut short. */
  async readText(path: string, limit: number): Promise<string> {
    const { size } = await this.stat(path);
    // An empty file has no byte 0 to ask for (a range would be answered 416).
    if (size === 0) return "";
    const buf = await this.readFile(path, { range: `bytes=0-${limit - 1}` });
    if (buf.includes(0)) return `(binary file, ${size} bytes)`;
    const text = new TextDecoder().decode(buf);
    return size > buf.length ? `${text}\n… (the first ${buf.length} of ${size} bytes)` : text;
  }
}

let client = new InspectorApi({ baseUrl, token: getToken() || undefined });
let current = getToken();

export function setToken(token: string): void {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage may be disabled; the token then lasts as long as the page.
  }
  current = token;
  client = new InspectorApi({ baseUrl, token: token || undefined });
}

/** The token in use (the stored one, or the one entered when storage is unavailable). */
export function token(): string {
  return current;
}

/** The REST client with the current token. */
export function api(): InspectorApi {
  return client;
}
