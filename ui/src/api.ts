// The daemon's REST surface as the page uses it (agents, instances, files), and the bearer
// token. Invariant: every API call goes through `apiFetch`, which sends the token kept in
// sessionStorage (never localStorage: it is gone when the tab closes) and turns any non-2xx
// answer into an `ApiError` carrying the problem+json body.

const TOKEN_KEY = "sandbox-agent.token";

export function getToken(): string {
  try {
    return sessionStorage.getItem(TOKEN_KEY) ?? "";
  } catch {
    return "";
  }
}

export function setToken(token: string): void {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage may be disabled; the token then lasts as long as the page.
  }
  memoryToken = token;
}

let memoryToken = getToken();

/** The token in use (the stored one, or the one entered when storage is unavailable). */
export function token(): string {
  return memoryToken;
}

/** The daemon's own origin: the page is served by it, so API paths are same-origin. */
export const baseUrl = location.origin;

/** An RFC 9457 problem body (the members every daemon error has, plus extras). */
export interface Problem {
  type?: string;
  title: string;
  status: number;
  detail?: string;
  [member: string]: unknown;
}

export class ApiError extends Error {
  readonly status: number;
  readonly problem: Problem;
  constructor(problem: Problem) {
    super(problem.detail ? `${problem.title}: ${problem.detail}` : problem.title);
    this.name = "ApiError";
    this.status = problem.status;
    this.problem = problem;
  }
}

export function authHeaders(extra: Record<string, string> = {}): Record<string, string> {
  const h = { ...extra };
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

export async function apiFetch(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = authHeaders((init.headers as Record<string, string> | undefined) ?? {});
  let res: Response;
  try {
    res = await fetch(path, { ...init, headers });
  } catch (error) {
    throw new ApiError({ title: "The daemon cannot be reached", status: 0, detail: String(error) });
  }
  if (res.ok) return res;
  let problem: Problem = { title: res.statusText || "Error", status: res.status };
  try {
    const body = (await res.json()) as Partial<Problem>;
    if (body && typeof body.title === "string") problem = { ...body, title: body.title, status: res.status };
  } catch {
    // Not JSON: keep the status line.
  }
  throw new ApiError(problem);
}

async function json<T>(path: string, init: RequestInit = {}): Promise<T> {
  const res = await apiFetch(path, init);
  return (await res.json()) as T;
}

export interface AgentInfo {
  id: string;
  installed: boolean;
  version?: string | null;
  path?: string | null;
  source?: string | null;
  credentialsAvailable?: boolean | null;
  serverStatus?: unknown;
}

export interface InstallResult {
  alreadyInstalled: boolean;
  artifacts: { kind: string; path: string; version?: string | null; source?: string | null }[];
}

export interface Instance {
  serverId: string;
  agent: string;
  createdAtMs?: number;
  status?: string;
  pid?: number | null;
  exitCode?: number | null;
  signal?: string | number | null;
  exitReason?: string | null;
  stderrTail?: string | null;
  lastEventId?: number | null;
  subscribers?: number;
  pendingRequests?: number;
  rssBytes?: number | null;
  cpuMs?: number | null;
  processes?: number | null;
}

export interface FsEntry {
  name: string;
  path: string;
  entryType: "file" | "directory" | string;
  size: number;
  modified?: string;
}

const q = (path: string) => `?path=${encodeURIComponent(path)}`;

export const api = {
  agents: () => json<{ agents: AgentInfo[] }>("/v1/agents").then((r) => r.agents),
  install: (id: string) =>
    json<InstallResult>(`/v1/agents/${encodeURIComponent(id)}/install`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: "{}",
    }),
  instances: () => json<{ servers: Instance[] }>("/v1/acp").then((r) => r.servers),
  stop: async (serverId: string) => {
    await apiFetch(`/v1/acp/${encodeURIComponent(serverId)}`, { method: "DELETE" });
  },
  /**
   * The exit details (problem body: `exitCode`, `exitReason`, `stderrTail`, …) of an exited
   * instance. Any request to it is answered with them; `Prefer: jsonrpc-errors` makes that a
   * JSON-RPC error in a 200 (the agent is gone, so nothing receives the request).
   */
  exitDetails: async (serverId: string) => {
    const res = await apiFetch(`/v1/acp/${encodeURIComponent(serverId)}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json", Prefer: "jsonrpc-errors" },
      body: JSON.stringify({ jsonrpc: "2.0", id: "inspector-exit-details", method: "_inspector/exit_details", params: {} }),
    });
    const body = (await res.json()) as { error?: { data?: Record<string, unknown> } };
    return body.error?.data ?? {};
  },
  entries: (path: string) => json<FsEntry[]>(`/v1/fs/entries${path ? q(path) : ""}`),
  stat: (path: string) => json<{ path: string; entryType: string; size: number }>(`/v1/fs/stat${q(path)}`),
  /** The first `limit` bytes of a file, and whether there were more. */
  read: async (path: string, limit: number) => {
    const res = await apiFetch(`/v1/fs/file${q(path)}`, { headers: { Range: `bytes=0-${limit - 1}` } });
    const buf = new Uint8Array(await res.arrayBuffer());
    const range = res.headers.get("Content-Range");
    const total = range ? Number(range.split("/")[1]) : buf.length;
    return { bytes: buf, truncated: Number.isFinite(total) && total > buf.length, total };
  },
  write: (path: string, body: Blob) =>
    json<{ path: string; bytesWritten: number }>(`/v1/fs/file${q(path)}`, {
      method: "PUT",
      headers: { "Content-Type": "application/octet-stream" },
      body,
    }),
};
