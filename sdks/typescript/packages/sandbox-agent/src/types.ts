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
/** One page of `GET /v1/sessions` and one session of it. */
export type SessionPage = Schemas["SessionPage"];
export type SessionItem = Schemas["SessionItem"];
export type ExitReason = Schemas["ExitReason"];
export type EntryType = Schemas["EntryType"];
export type FsEntry = Schemas["FsEntry"];
export type FsStat = Schemas["FsStat"];
/** One change of `GET /v1/fs/watch` (`kind` create, modify, remove or rename). */
export type WatchChange = Schemas["WatchChange"];
export type WriteFileResult = Schemas["WriteOutcome"];
export type PathResult = Schemas["FsPath"];
export type MoveRequest = Schemas["FsMoveRequest"];
export type MoveResult = Schemas["FsMoved"];
export type UploadBatchResult = Schemas["UploadOutcome"];
export type McpEntry = Schemas["McpEntry"];
export type SkillsEntry = Schemas["SkillsEntry"];
export type SkillSource = Schemas["SkillSource"];

// Processes (`/v1/processes`), under the names of the published `sandbox-agent` 0.4.2 SDK.
type Operations = import("./generated/openapi.js").operations;
type QueryOf<O extends keyof Operations> = NonNullable<Operations[O]["parameters"]["query"]>;
export type ProcessConfig = Schemas["ProcessConfig"];
export type ProcessCreateRequest = Schemas["CreateRequest"];
export type ProcessInfo = Schemas["ProcessInfo"];
export type ProcessStats = Schemas["ProcessStats"];
export type ProcessState = "running" | "exited";
export type ProcessOwner = "user" | "desktop" | "system";
export type ProcessInputRequest = Schemas["InputRequest"];
export type ProcessInputResponse = Schemas["InputResponse"];
export type ProcessListQuery = { owner?: ProcessOwner } & PageQuery;
/**
 * One page of a list route: at most `limit` items (1..=1000), after the page whose `nextCursor`
 * is `cursor`. Without `limit` a list route answers every item.
 */
export type PageQuery = { limit?: number; cursor?: string };
/** A page of items; `nextCursor` is present when more may follow (pass it back unchanged). */
export type Page<T> = { items: T[]; nextCursor?: string };
export type ProcessListResponse = Schemas["ProcessListResponse"];
export type ProcessLogEntry = Schemas["LogEntry"];
export type ProcessLogStream = Schemas["LogStream"];
export type ProcessLogsStream = Schemas["StreamFilter"];
export type ProcessLogsQuery = QueryOf<"getProcessLogs">;
export type ProcessLogFollowQuery = Omit<ProcessLogsQuery, "follow">;
export type ProcessLogsResponse = Schemas["ProcessLogsResponse"];
/** Output that was dropped before a reader got it: bytes `[from, to)`. */
export type ProcessLogGap = Schemas["Gap"];
export type ProcessRunRequest = Schemas["RunRequest"];
export type ProcessRunResponse = Schemas["RunResponse"];
export type ProcessSignalQuery = QueryOf<"stopProcess">;
export type ProcessTerminalResizeRequest = Schemas["TerminalSize"];
export type ProcessTerminalResizeResponse = Schemas["TerminalSize"];
export type { components as OpenApiComponents, paths as OpenApiPaths } from "./generated/openapi.js";

// The workspace API (`/v1/git/*`, `/v1/fs/glob`, `/v1/fs/grep`, `/v1/ports*`; docs/workspace.md).
export type GitStatus = Schemas["GitStatus"];
export type GitFileStatus = Schemas["GitFileStatus"];
export type GitDiff = Schemas["GitDiff"];
export type GitDiffFile = Schemas["GitDiffFile"];
export type GitLog = Schemas["GitLog"];
export type GitCommit = Schemas["GitCommit"];
export type GitAuthor = Schemas["GitAuthor"];
export type GitSha = Schemas["GitSha"];
export type GitCommitRequest = Schemas["GitCommitRequest"];
export type GitBranches = Schemas["GitBranches"];
export type GitBranch = Schemas["GitBranch"];
export type GitCheckedOut = Schemas["GitCheckedOut"];
export type GitCheckoutRequest = Schemas["GitCheckoutRequest"];
export type GitWorktree = Schemas["GitWorktree"];
export type GitWorktreeRequest = Schemas["GitWorktreeRequest"];
export type GitCloneRequest = Schemas["GitCloneRequest"];
export type GlobResult = Schemas["GlobResult"];
export type GrepResult = Schemas["GrepResult"];
export type GrepMatch = Schemas["GrepMatch"];
export type PortInfo = Schemas["PortInfo"];
export type Preview = Schemas["Preview"];
/** A session's `gitBase` as `GET /v1/acp` lists it. */
export type SessionGitBase = Schemas["SessionGitBase"];
export type GlobQuery = { path?: string; pattern: string; hidden?: boolean; limit?: number };
export type GrepQuery = {
  path?: string;
  pattern: string;
  glob?: string;
  ignoreCase?: boolean;
  hidden?: boolean;
  limit?: number;
};

// Desktop (`/v1/desktop/*`), under the schema names of the daemon's OpenAPI document.
export type DesktopStatus = Schemas["DesktopStatusResponse"];
export type DesktopStartRequest = Schemas["DesktopStartRequest"];
export type DesktopDisplayInfo = Schemas["DesktopDisplayInfoResponse"];
export type DesktopScreenshotQuery = QueryOf<"get_v1_desktop_screenshot">;
export type DesktopScreenshotRegionQuery = QueryOf<"get_v1_desktop_screenshot_region">;
export type DesktopMousePosition = Schemas["DesktopMousePositionResponse"];
export type DesktopMouseMoveRequest = Schemas["DesktopMouseMoveRequest"];
export type DesktopMouseClickRequest = Schemas["DesktopMouseClickRequest"];
export type DesktopMouseButtonRequest = Schemas["DesktopMouseButtonRequest"];
export type DesktopMouseDragRequest = Schemas["DesktopMouseDragRequest"];
export type DesktopMouseScrollRequest = Schemas["DesktopMouseScrollRequest"];
export type DesktopKeyboardTypeRequest = Schemas["DesktopKeyboardTypeRequest"];
export type DesktopKeyboardPressRequest = Schemas["DesktopKeyboardPressRequest"];
export type DesktopKeyboardKeyRequest = Schemas["DesktopKeyboardKeyRequest"];
export type DesktopActionResponse = Schemas["DesktopActionResponse"];
export type DesktopWindowInfo = Schemas["DesktopWindowInfo"];
export type DesktopWindowMoveRequest = Schemas["DesktopWindowMoveRequest"];
export type DesktopWindowResizeRequest = Schemas["DesktopWindowResizeRequest"];
export type DesktopClipboard = Schemas["DesktopClipboardResponse"];
export type DesktopClipboardQuery = QueryOf<"get_v1_desktop_clipboard">;
export type DesktopClipboardWriteRequest = Schemas["DesktopClipboardWriteRequest"];
export type DesktopLaunchRequest = Schemas["DesktopLaunchRequest"];
export type DesktopLaunchResponse = Schemas["DesktopLaunchResponse"];
export type DesktopOpenRequest = Schemas["DesktopOpenRequest"];
export type DesktopOpenResponse = Schemas["DesktopOpenResponse"];
export type DesktopRecordingStartRequest = Schemas["DesktopRecordingStartRequest"];
export type DesktopRecordingInfo = Schemas["DesktopRecordingInfo"];
export type DesktopStreamStatus = Schemas["DesktopStreamStatusResponse"];
export type DesktopLiveViewQuery = QueryOf<"connectDesktopStream">;

// Browser (`/v1/browser/*`), under the schema names of the daemon's OpenAPI document.
export type BrowserStatus = Schemas["BrowserStatus"];
export type BrowserStartRequest = Schemas["BrowserStartRequest"];
export type BrowserTab = Schemas["BrowserTab"];
export type BrowserOpenTabRequest = Schemas["BrowserOpenTabRequest"];
export type BrowserNavigateRequest = Schemas["BrowserNavigateRequest"];
export type BrowserScreenshotQuery = QueryOf<"getBrowserScreenshot">;
export type BrowserContentQuery = QueryOf<"getBrowserContent">;
export type BrowserContent = Schemas["BrowserContent"];
export type BrowserAccessibilityQuery = QueryOf<"getBrowserAccessibility">;
export type BrowserAccessibility = Schemas["BrowserAccessibility"];
export type BrowserAxNode = Schemas["AxNode"];
