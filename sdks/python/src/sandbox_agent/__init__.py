"""Sandbox Agent's Python SDK: drive coding agents, files and processes in a sandbox over the
daemon's HTTP API, with asyncio."""

__version__ = "0.5.0"

from .client import (  # noqa: E402
    NewSessionResult,
    PermissionReply,
    PermissionRequest,
    SandboxAgentClient,
    SessionUpdateEvent,
    UpdateStream,
)
from .errors import (  # noqa: E402
    AgentError,
    AgentTimeoutError,
    AgentUnavailableError,
    AlreadyConnectedError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    GoneError,
    HttpError,
    NetworkError,
    NotConnectedError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionReplyError,
    SandboxAgentError,
    ServiceUnavailableError,
    StartError,
    TooManyRequestsError,
    UnauthorizedError,
    UnsupportedError,
)
from .browser import (  # noqa: E402
    BrowserAccessibility,
    BrowserApi,
    BrowserAxNode,
    BrowserContent,
    BrowserLastError,
    BrowserStatus,
    BrowserTab,
)
from .desktop import (  # noqa: E402
    DesktopApi,
    DesktopClipboard,
    DesktopDisplayInfo,
    DesktopLaunchResult,
    DesktopLiveView,
    DesktopMousePosition,
    DesktopRecording,
    DesktopResolution,
    DesktopStatus,
    DesktopWindow,
)
from .host import ByteStream, HostApi, LogStream, WatchStream  # noqa: E402
from .local import LocalStart, SandboxAgent, start_local  # noqa: E402
from .models import (  # noqa: E402
    AgentInfo,
    FsEntry,
    FsStat,
    Gap,
    GitAuthor,
    GitBranch,
    GitBranches,
    GitCheckedOut,
    GitCommit,
    GitDiff,
    GitDiffFile,
    GitFileStatus,
    GitLog,
    GitSha,
    GitStatus,
    GitWorktree,
    GlobResult,
    GrepMatch,
    GrepResult,
    PortInfo,
    Preview,
    SessionGitBase,
    Health,
    InstanceInfo,
    SessionItem,
    SessionPage,
    MoveResult,
    Page,
    PathResult,
    ProcessConfig,
    ProcessInfo,
    ProcessLogEntry,
    ProcessLogs,
    ProcessRunResult,
    UploadBatchResult,
    WatchChange,
    WatchItem,
    WatchRescan,
    WriteFileResult,
)
from .sandbox import SandboxDetachedError, SandboxProvider, SandboxStartError  # noqa: E402
from .terminal import ProcessTerminal  # noqa: E402
from .session_store import InMemorySessionStore, JsonFileSessionStore, SessionRecord, SessionStore  # noqa: E402

__all__ = [
    "__version__",
    "AgentError", "AgentInfo", "AgentTimeoutError", "AgentUnavailableError", "AlreadyConnectedError",
    "BadRequestError", "BrowserAccessibility", "BrowserApi", "BrowserAxNode", "BrowserContent", "BrowserLastError",
    "BrowserStatus", "BrowserTab", "ByteStream", "DesktopApi", "DesktopClipboard", "DesktopDisplayInfo", "DesktopLaunchResult",
    "DesktopLiveView", "DesktopMousePosition", "DesktopRecording", "DesktopResolution", "DesktopStatus", "DesktopWindow", "ConflictError", "ForbiddenError", "FsEntry", "FsStat", "Gap", "GoneError",
    "Health", "HostApi", "HttpError", "InMemorySessionStore", "InstanceInfo", "SessionItem", "SessionPage", "JsonFileSessionStore", "LocalStart", "LogStream",
    "MoveResult", "NetworkError", "Page", "NewSessionResult", "NotConnectedError", "NotFoundError", "PathResult",
    "PayloadTooLargeError", "PermissionReply", "PermissionReplyError", "PermissionRequest", "ProcessConfig",
    "ProcessInfo", "ProcessLogEntry", "ProcessTerminal", "ProcessLogs", "ProcessRunResult", "SandboxAgent", "SandboxAgentClient",
    "SandboxAgentError", "SandboxDetachedError", "SandboxProvider", "SandboxStartError", "ServiceUnavailableError", "SessionRecord", "SessionStore", "SessionUpdateEvent",
    "StartError", "TooManyRequestsError", "UnauthorizedError", "UnsupportedError", "UpdateStream",
    "GitAuthor", "GitBranch", "GitBranches", "GitCheckedOut", "GitCommit", "GitDiff", "GitDiffFile", "GitFileStatus", "GitLog", "GitSha", "GitStatus", "GitWorktree", "GlobResult", "GrepMatch", "GrepResult", "PortInfo", "Preview", "SessionGitBase",
    "UploadBatchResult", "WatchChange", "WatchItem", "WatchRescan", "WatchStream", "WriteFileResult", "start_local",
]
