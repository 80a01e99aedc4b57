/**
 * Request and response shapes of the daemon's host APIs (agents, instances, files, config).
 *
 * Hand-written from docs/acp.md, docs/files.md, docs/agents.md and the wire contract until the
 * daemon's OpenAPI document exists on this branch; `npm run generate` then writes
 * `generated/openapi.ts` from docs/openapi.json and these aliases point at it.
 */

export interface Health {
  status: string;
}

export interface AgentServerStatus {
  running: number;
  status: "running" | "stopped";
}

export interface AgentInfo {
  id: string;
  name: string;
  installed: boolean;
  version: string | null;
  path: string | null;
  source: string;
  credentialsAvailable: boolean;
  capabilities: Record<string, unknown>;
  installCommand?: string;
  serverStatus: AgentServerStatus;
}

export interface InstallAgentRequest {
  reinstall?: boolean;
  agentVersion?: string;
  agentProcessVersion?: string;
}

export interface InstallArtifact {
  kind: string;
  path: string;
  version?: string | null;
  source: string;
}

export interface InstallAgentResult {
  alreadyInstalled: boolean;
  already_installed: boolean;
  source?: string;
  version?: string | null;
  artifacts: InstallArtifact[];
}

export interface InstanceInfo {
  serverId: string;
  agent: string;
  createdAtMs: number;
  status: "starting" | "running" | "exited";
  pid: number | null;
  exitCode: number | null;
  signal: string | number | null;
  exitReason: string | null;
  lastEventId: number;
  subscribers: number;
  pendingRequests: number;
  invalidStdoutLines?: number;
  rssBytes: number | null;
  cpuMs: number | null;
  processes: number | null;
  openFds?: number | null;
}

export type EntryType = "file" | "directory";

export interface FsEntry {
  name: string;
  path: string;
  entryType: EntryType;
  size: number;
  modified?: string;
}

export interface FsStat {
  path: string;
  entryType: EntryType;
  size: number;
  modified?: string;
}

export interface WriteFileResult {
  path: string;
  bytesWritten: number;
}

export interface PathResult {
  path: string;
}

export interface MoveRequest {
  from: string;
  to: string;
  overwrite?: boolean;
}

export interface MoveResult {
  from: string;
  to: string;
}

export interface UploadBatchResult {
  /** The first 1024 extracted paths. */
  paths: string[];
  truncated: boolean;
}

export interface McpLocalEntry {
  type: "local";
  command: string | string[];
  args?: string[];
  env?: Record<string, string>;
  enabled?: boolean;
  timeoutMs?: number;
  cwd?: string;
}

export interface McpRemoteEntry {
  type: "remote";
  url: string;
  headers?: Record<string, string>;
  bearerTokenEnvVar?: string;
  envHeaders?: Record<string, string>;
  oauth?: unknown;
  enabled?: boolean;
  timeoutMs?: number;
  transport?: "http" | "sse";
}

export type McpEntry = McpLocalEntry | McpRemoteEntry;

export interface SkillSource {
  type: string;
  source: string;
  skills?: string[];
  ref?: string;
  subpath?: string;
}

export interface SkillsEntry {
  sources: SkillSource[];
}
