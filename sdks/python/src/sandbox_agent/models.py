"""Answers of the host APIs, as pydantic models: snake_case fields (the daemon's camelCase names
are accepted as aliases), unknown fields kept."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "Model",
    "Health",
    "AgentInfo",
    "InstanceInfo",
    "SessionItem",
    "SessionPage",
    "FsEntry",
    "FsStat",
    "WriteFileResult",
    "PathResult",
    "MoveResult",
    "UploadBatchResult",
    "WatchChange",
    "WatchRescan",
    "WatchItem",
    "Gap",
    "ProcessInfo",
    "ProcessRunResult",
    "ProcessLogEntry",
    "ProcessLogs",
    "ProcessConfig",
    "Page",
    "SessionGitBase",
    "GitFileStatus",
    "GitStatus",
    "GitDiffFile",
    "GitDiff",
    "GitAuthor",
    "GitCommit",
    "GitLog",
    "GitSha",
    "GitBranch",
    "GitBranches",
    "GitCheckedOut",
    "GitWorktree",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "PortInfo",
    "Preview",
]


_T = TypeVar("_T")


@dataclass
class Page(Generic[_T]):
    """One page of a list route: ``items``, and ``next_cursor`` when more may follow (pass it back
    unchanged as ``cursor``). ``limit`` is 1..1000; without it a list route answers every item."""

    items: list[_T] = field(default_factory=list)
    next_cursor: str | None = None


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class Health(Model):
    status: str


class AgentInfo(Model):
    id: str
    installed: bool = False
    version: str | None = None


class SessionGitBase(Model):
    """A session of an instance whose ``cwd`` is in a git repository, with that repository's
    HEAD when the session was created or loaded: ``git_diff(cwd, git_base)`` is what it changed."""

    session_id: str
    cwd: str
    git_base: str


class InstanceInfo(Model):
    server_id: str
    agent: str
    status: str
    created_at_ms: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    exit_reason: str | None = None
    last_event_id: int = 0
    subscribers: int = 0
    pending_requests: int = 0
    sessions: list[SessionGitBase] = []


class SessionItem(Model):
    """One session of the daemon's inventory (``GET /v1/sessions``)."""

    server_id: str
    session_id: str
    agent: str
    state: str
    created_at_ms: int
    last_activity_at_ms: int
    cwd: str | None = None
    title: str | None = None
    git_base: str | None = None


class SessionPage(Model):
    """One page of ``GET /v1/sessions``; ``next_cursor`` is ``None`` on the last page."""

    sessions: list[SessionItem]
    next_cursor: str | None = None


class FsEntry(Model):
    name: str
    path: str
    entry_type: Literal["file", "directory"]
    size: int
    modified: str | None = None


class FsStat(Model):
    path: str
    entry_type: Literal["file", "directory"]
    size: int
    modified: str | None = None


class WriteFileResult(Model):
    path: str
    bytes_written: int


class PathResult(Model):
    path: str


class MoveResult(Model):
    from_: str = Field(alias="from")
    to: str


class UploadBatchResult(Model):
    paths: list[str]
    truncated: bool


class WatchChange(Model):
    kind: Literal["create", "modify", "remove", "rename"]
    path: str
    entry_type: Literal["file", "directory"]
    old_path: str | None = None


class WatchRescan(Model):
    """Changes may have been missed before this point: re-read what you mirror."""

    kind: Literal["rescan"] = "rescan"
    reason: Literal["start", "overflow", "reconnect"]
    cause: str | None = None


WatchItem = WatchChange | WatchRescan


class Gap(Model):
    """Events (ACP) or output bytes (process logs) ``from_``..``to`` were lost."""

    from_: int = Field(alias="from")
    to: int


class ProcessInfo(Model):
    id: str
    command: str
    args: list[str] = []
    cwd: str | None = None
    tty: bool = False
    interactive: bool = False
    status: Literal["running", "exited"]
    pid: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    exit_reason: str | None = None
    created_at_ms: int | None = None
    exited_at_ms: int | None = None
    log_end: int = 0


class ProcessRunResult(Model):
    exit_code: int | None = None
    exit_signal: int | None = None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int


class ProcessLogEntry(Model):
    """One chunk of output; ``sequence`` is the byte offset just after it (and its SSE id)."""

    sequence: int
    stream: str
    timestamp_ms: int
    data: bytes
    encoding: str = "base64"

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> ProcessLogEntry:
        enc = raw.get("encoding", "base64")
        text = raw.get("data", "")
        data = base64.b64decode(text) if enc == "base64" else str(text).encode()
        return cls.model_validate({**raw, "data": data, "encoding": "bytes"})

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


class ProcessLogs(Model):
    process_id: str | None = None
    entries: list[ProcessLogEntry]
    end: int
    gap: Gap | None = None


class ProcessConfig(Model):
    max_concurrent_processes: int
    default_run_timeout_ms: int
    max_run_timeout_ms: int
    max_output_bytes: int
    max_log_bytes_per_process: int
    max_input_bytes_per_request: int


# -- the workspace API (docs/workspace.md): git, search, ports and preview links ----------------

GitChange = Literal["modified", "added", "deleted", "renamed", "untracked", "conflicted"]


class GitFileStatus(Model):
    """One changed file; ``path`` is relative to the repository's top level. A file changed in
    the index and in the work tree is listed twice (``staged`` true, then false)."""

    path: str
    status: GitChange
    staged: bool
    old_path: str | None = None


class GitStatus(Model):
    branch: str | None = None
    head: str | None = None
    files: list[GitFileStatus]
    upstream: str | None = None
    ahead: int | None = None
    behind: int | None = None


class GitDiffFile(Model):
    path: str
    status: GitChange
    additions: int
    deletions: int
    binary: bool
    patch: str
    old_path: str | None = None


class GitDiff(Model):
    """The work tree (untracked files included) against ``base``, a full commit id."""

    base: str
    files: list[GitDiffFile]


class GitAuthor(Model):
    name: str
    email: str


class GitCommit(Model):
    sha: str
    parents: list[str]
    author: GitAuthor
    time: int
    """Unix seconds."""
    subject: str


class GitLog(Model):
    """Commits, newest first."""

    commits: list[GitCommit]


class GitSha(Model):
    sha: str


class GitBranch(Model):
    name: str
    head: str


class GitBranches(Model):
    current: str | None = None
    branches: list[GitBranch]


class GitCheckedOut(Model):
    branch: str


class GitWorktree(Model):
    """A work tree (a clone's, or one of ``list_worktrees``): its path, branch and HEAD."""

    path: str
    branch: str | None = None
    head: str | None = None


class GlobResult(Model):
    paths: list[str]
    truncated: bool


class GrepMatch(Model):
    path: str
    line: int
    """1-based."""
    column: int
    """1-based byte offset of the first match in the line."""
    text: str


class GrepResult(Model):
    matches: list[GrepMatch]
    truncated: bool


class PortInfo(Model):
    """A TCP listener inside the sandbox; ``process_id``/``server_id`` name the ``/v1/processes``
    process or agent instance it belongs to."""

    port: int
    address: str
    pid: int | None = None
    command: str | None = None
    process_id: str | None = None
    server_id: str | None = None


class Preview(Model):
    """A signed link to a port that works without the token until ``expires_at`` (RFC 3339)."""

    url: str
    expires_at: str
