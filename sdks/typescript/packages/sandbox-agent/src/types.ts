/**
 * Request and response shapes of the daemon's host APIs (agents, instances, files, config), as
 * names over the types generated from the daemon's OpenAPI document (`generated/openapi.ts`,
 * written by `npm run generate` from docs/openapi.json; a test checks it is current).
 */
import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type Health = Schemas["Health"];
export type AgentInfo = Schemas["AgentInfo"];
export type AgentServerStatus = Schemas["AgentServerStatus"];
export type InstallAgentRequest = Schemas["InstallRequest"];
export type InstallAgentResult = Schemas["InstallOutcome"];
export type InstallArtifact = Schemas["Artifact"];
/** One agent instance (`serverId`) as `GET /v1/acp` lists it. */
export type InstanceInfo = Schemas["ServerInfo"];
export type InstanceStatus = Schemas["ServerStatus"];
export type ExitReason = Schemas["ExitReason"];
export type EntryType = Schemas["EntryType"];
export type FsEntry = Schemas["FsEntry"];
export type FsStat = Schemas["FsStat"];
export type WriteFileResult = Schemas["WriteOutcome"];
export type PathResult = Schemas["FsPath"];
export type MoveRequest = Schemas["FsMoveRequest"];
export type MoveResult = Schemas["FsMoved"];
export type UploadBatchResult = Schemas["UploadOutcome"];
export type McpEntry = Schemas["McpEntry"];
export type SkillsEntry = Schemas["SkillsEntry"];
export type SkillSource = Schemas["SkillSource"];
export type { components as OpenApiComponents, paths as OpenApiPaths } from "./generated/openapi.js";
