/**
 * `sandbox-agent`: the TypeScript SDK of the Sandbox Agent daemon. Browser-safe: Node-only parts
 * live in `sandbox-agent/local` (starting a daemon), `sandbox-agent/file-store` and the sandbox
 * providers `sandbox-agent/docker` and `sandbox-agent/kubernetes`.
 */
export {
  SandboxAgentClient,
  type SandboxAgentClientOptions,
  type SessionUpdateEvent,
  type PermissionRequest,
  type PermissionReply,
  type NewSessionOptions,
  type PromptOptions,
} from "./client.js";
export {
  SandboxAgent,
  SandboxStartError,
  SandboxDetachedError,
  type SandboxProvider,
  type SandboxStartOptions,
  type SandboxStep,
} from "./sandbox.js";
export { HostApi, type HostOptions, type BodySource, type ConfigKey, type ImportedSession } from "./host.js";
export {
  ProcessTerminalSession,
  type FollowProcessLogsOptions,
  type ProcessLogListener,
  type ProcessLogSubscription,
  type ProcessTerminalConnectOptions,
  type ProcessTerminalUrlOptions,
  type ProcessTerminalClientFrame,
  type ProcessTerminalServerFrame,
  type ProcessTerminalReadyFrame,
  type ProcessTerminalExitFrame,
  type ProcessTerminalErrorFrame,
  type WebSocketConstructor,
} from "./processes.js";
export { BrowserApi, type BrowserTransport } from "./browser.js";
export {
  DesktopApi,
  DesktopLiveView,
  type DesktopLiveViewInput,
  type DesktopLiveViewReady,
} from "./desktop.js";
export { type WatchOptions, type WatchItem, type WatchRescan } from "./watch.js";
export { HttpError, NotConnectedError, AlreadyConnectedError, UnsupportedError, AgentError, PermissionReplyError } from "./errors.js";
export { InMemorySessionStore, type SessionRecord, type SessionStore } from "./session-store.js";
export type { GapEvent, ProblemDetails } from "acp-http-client";
export type * from "./types.js";
