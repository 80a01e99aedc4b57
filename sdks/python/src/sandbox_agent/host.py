"""``HostApi``: the daemon's host APIs (health, agents, instances, files, watch, config,
processes). Needs no agent and no connection."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import warnings
from urllib.parse import urlencode
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

import httpx

from ._sse import SseEventTooLarge, parse_sse
from .errors import HttpError, NetworkError, http_error, network_problem, problem_from_body
from .models import (
    AgentInfo,
    GitAuthor,
    GitBranches,
    GitCheckedOut,
    GitDiff,
    GitLog,
    GitSha,
    GitStatus,
    GitWorktree,
    GlobResult,
    GrepResult,
    PortInfo,
    Preview,
    FsEntry,
    FsStat,
    Gap,
    Health,
    InstanceInfo,
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

if TYPE_CHECKING:
    from .browser import BrowserApi
    from .desktop import DesktopApi
    from .terminal import ProcessTerminal

__all__ = ["HostApi", "ByteStream", "WatchStream", "LogStream", "BodySource"]

BodySource = bytes | str | AsyncIterable[bytes] | IO[bytes]
T = TypeVar("T")
_CHUNK = 1 << 20
_S = TypeVar("_S", bound="_Stream[Any]")


async def _call_maybe(fn: Callable[..., Any], *args: Any) -> None:
    result = fn(*args)
    if inspect.isawaitable(result):
        await result


class HostApi:
    """The host APIs of one daemon. ``async with HostApi(url) as host:`` closes the HTTP pool on
    exit (else call :meth:`aclose`)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._headers = dict(headers or {})
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self: _H) -> _H:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- plumbing ---------------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """One request; a 2xx response, else the matching :class:`HttpError`."""
        clean = {k: _qv(v) for k, v in (params or {}).items() if v is not None}
        req = self._http.build_request(
            method,
            path,
            params=clean,
            json=json_body,
            content=content,
            headers=headers,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        try:
            res = await self._http.send(req, stream=stream)
        except httpx.TransportError as e:
            raise NetworkError(network_problem(str(req.url), e)) from e
        if res.is_success:
            return res
        try:
            body = await res.aread()
        finally:
            await res.aclose()
        raise http_error(problem_from_body(res.status_code, body, res.headers.get("content-type", ""), str(req.url)))

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        res = await self._send(method, path, **kw)
        return res.json() if res.content else None

    # -- health, agents, instances ---------------------------------------------------------------

    @property
    def browser(self) -> BrowserApi:
        """The browser routes (``/v1/browser/*``) and the DevTools proxy's URLs."""
        from .browser import BrowserApi

        return BrowserApi(self)

    @property
    def desktop(self) -> DesktopApi:
        """The desktop routes (``/v1/desktop/*``) and its live view."""
        from .desktop import DesktopApi

        return DesktopApi(self)

    async def get_health(self) -> Health:
        return Health.model_validate(await self._json("GET", "/v1/health"))

    async def list_agents(self) -> list[AgentInfo]:
        return [AgentInfo.model_validate(a) for a in (await self._json("GET", "/v1/agents"))["agents"]]

    async def get_agent(self, agent: str) -> AgentInfo:
        return AgentInfo.model_validate(await self._json("GET", f"/v1/agents/{_seg(agent)}"))

    async def install_agent(self, agent: str, **request: Any) -> dict[str, Any]:
        """``POST /v1/agents/{agent}/install``; ``request`` as the daemon takes it
        (``reinstall=True``, ``agentVersion=…``). Returns the install outcome as sent."""
        body = await self._json("POST", f"/v1/agents/{_seg(agent)}/install", json_body=request)
        return dict(body or {})

    async def list_instances(self) -> list[InstanceInfo]:
        return [InstanceInfo.model_validate(s) for s in (await self._json("GET", "/v1/acp"))["servers"]]

    async def list_all_sessions(
        self, *, limit: int | None = None, cursor: str | None = None, server_id: str | None = None
    ) -> SessionPage:
        """One page of every ACP session the daemon knows, across all serverIds
        (``GET /v1/sessions``); pass ``next_cursor`` as ``cursor`` for the next page. (``list_sessions``
        is the ACP method of one connected agent; this is the daemon's inventory.)"""
        params = {
            "limit": None if limit is None else str(limit),
            "cursor": cursor,
            "serverId": server_id,
        }
        return SessionPage.model_validate(await self._json("GET", "/v1/sessions", params=params))

    async def list_instances_page(self, *, limit: int | None = None, cursor: str | None = None) -> Page[InstanceInfo]:
        """One page of the instances, by ``serverId``."""
        body = await self._json("GET", "/v1/acp", params={"limit": limit, "cursor": cursor})
        return Page([InstanceInfo.model_validate(s) for s in body["servers"]], body.get("nextCursor"))

    async def list_agents_page(self, *, limit: int | None = None, cursor: str | None = None) -> Page[AgentInfo]:
        """One page of the known agents, by id."""
        body = await self._json("GET", "/v1/agents", params={"limit": limit, "cursor": cursor})
        return Page([AgentInfo.model_validate(a) for a in body["agents"]], body.get("nextCursor"))

    # -- files -----------------------------------------------------------------------------------

    async def list_entries(self, path: str | None = None) -> list[FsEntry]:
        return [FsEntry.model_validate(e) for e in await self._json("GET", "/v1/fs/entries", params={"path": path})]

    async def list_entries_page(
        self, path: str | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[FsEntry]:
        """One page of a directory's entries, by name (the next cursor travels in the
        ``Sandbox-Agent-Next-Cursor`` response header)."""
        res = await self._send("GET", "/v1/fs/entries", params={"path": path, "limit": limit, "cursor": cursor})
        return Page([FsEntry.model_validate(e) for e in res.json()], res.headers.get("sandbox-agent-next-cursor"))

    async def stat(self, path: str) -> FsStat:
        return FsStat.model_validate(await self._json("GET", "/v1/fs/stat", params={"path": path}))

    async def read_file(self, path: str, *, range: str | None = None) -> bytes:
        res = await self._send("GET", "/v1/fs/file", params={"path": path}, headers=_range(range))
        return res.content

    def read_file_stream(self, path: str, *, range: str | None = None, chunk_size: int = 65536) -> ByteStream:
        """The file's bytes as they arrive (``async with host.read_file_stream(p) as s: async for
        chunk in s``); opened on entering the block, where a 404 or 403 is raised."""
        return ByteStream(self, path, range, chunk_size)

    async def write_file(self, path: str, data: BodySource) -> WriteFileResult:
        """Writes the whole file (replaced atomically). ``data``: bytes, text (UTF-8), an async
        iterable of bytes or a binary file object; streams are sent chunk by chunk."""
        body = await self._send(
            "PUT",
            "/v1/fs/file",
            params={"path": path},
            content=_body(data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return WriteFileResult.model_validate(body.json())

    async def delete_entry(self, path: str, *, recursive: bool = False) -> PathResult:
        params: dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = True
        return PathResult.model_validate(await self._json("DELETE", "/v1/fs/entry", params=params))

    async def mkdir(self, path: str) -> PathResult:
        return PathResult.model_validate(await self._json("POST", "/v1/fs/mkdir", params={"path": path}))

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> MoveResult:
        body = {"from": src, "to": dst, "overwrite": overwrite}
        return MoveResult.model_validate(await self._json("POST", "/v1/fs/move", json_body=body))

    async def upload_batch(
        self, archive: bytes | AsyncIterable[bytes] | IO[bytes], *, path: str | None = None, gzip: bool = False
    ) -> UploadBatchResult:
        """Extracts a tar (``gzip=True``: tar.gz) into ``path`` (default: the work dir), all or nothing."""
        body = await self._json(
            "POST",
            "/v1/fs/upload-batch",
            params={"path": path},
            content=_body(archive),
            headers={"Content-Type": "application/gzip" if gzip else "application/x-tar"},
        )
        return UploadBatchResult.model_validate(body)

    def export_session(self, server_id: str, *, chunk_size: int = 65536) -> ByteStream:
        """The serverId's session bundle (tar+gzip) as it arrives, nothing buffered beyond one
        chunk (``async with host.export_session(id) as s: async for chunk in s``); opened on
        entering the block, where a 409 (a turn in progress) or 404 is raised."""
        return ByteStream(self, f"/v1/acp/{_seg(server_id)}/bundle", None, chunk_size, params={})

    async def import_session(
        self,
        server_id: str,
        bundle: bytes | AsyncIterable[bytes] | IO[bytes],
        *,
        cwd: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Imports a bundle (bytes, an async iterable of bytes, e.g. an ``export_session`` stream,
        or a binary file object; streamed) as ``server_id``; its next POST restores the
        sessions. ``cwd`` maps each old absolute cwd to the new one. Answers ``{serverId, agent,
        sessions, events, files}``."""
        query = urlencode([("cwd", f"{old}={new}") for old, new in (cwd or {}).items()])
        path = f"/v1/acp/{_seg(server_id)}/bundle" + (f"?{query}" if query else "")
        body = await self._json(
            "POST",
            path,
            content=_body(bundle),
            headers={"Content-Type": "application/gzip"},
        )
        return dict(body)

    def watch(
        self,
        path: str,
        *,
        recursive: bool = False,
        ignore: Sequence[str] = (),
        max_reconnect_delay: float = 5.0,
    ) -> WatchStream:
        """Every change beneath the directory ``path``: ``async with host.watch(".") as w: async
        for item in w``. The first item is ``WatchRescan(reason="start")``."""
        return WatchStream(self, path, recursive, tuple(ignore), max_reconnect_delay)

    # -- config ----------------------------------------------------------------------------------

    async def get_mcp_config(self, directory: str, mcp_name: str) -> dict[str, Any]:
        return dict(await self._json("GET", "/v1/config/mcp", params={"directory": directory, "mcpName": mcp_name}))

    async def set_mcp_config(self, directory: str, mcp_name: str, entry: Mapping[str, Any]) -> None:
        await self._send("PUT", "/v1/config/mcp", params={"directory": directory, "mcpName": mcp_name}, json_body=dict(entry))

    async def delete_mcp_config(self, directory: str, mcp_name: str) -> None:
        await self._send("DELETE", "/v1/config/mcp", params={"directory": directory, "mcpName": mcp_name})

    async def get_skills_config(self, directory: str, skill_name: str) -> dict[str, Any]:
        q = {"directory": directory, "skillName": skill_name}
        return dict(await self._json("GET", "/v1/config/skills", params=q))

    async def set_skills_config(self, directory: str, skill_name: str, entry: Mapping[str, Any]) -> None:
        q = {"directory": directory, "skillName": skill_name}
        await self._send("PUT", "/v1/config/skills", params=q, json_body=dict(entry))

    async def delete_skills_config(self, directory: str, skill_name: str) -> None:
        await self._send("DELETE", "/v1/config/skills", params={"directory": directory, "skillName": skill_name})

    # -- workspace: git, search, ports and preview links (docs/workspace.md) ---------------------

    async def git_status(self, path: str) -> GitStatus:
        """Branch, HEAD and changed files of the repository ``path`` is in."""
        return GitStatus.model_validate(await self._json("GET", "/v1/git/status", params={"path": path}))

    async def git_diff(self, path: str, base: str | None = None) -> GitDiff:
        """The work tree (untracked files included) against ``base`` (default HEAD)."""
        return GitDiff.model_validate(await self._json("GET", "/v1/git/diff", params={"path": path, "base": base}))

    async def git_log(self, path: str, limit: int | None = None) -> GitLog:
        """Commits reachable from HEAD, newest first (``limit`` default 50, at most 1000)."""
        return GitLog.model_validate(await self._json("GET", "/v1/git/log", params={"path": path, "limit": limit}))

    async def git_commit(
        self, path: str, message: str, *, all: bool = False, author: GitAuthor | Mapping[str, str] | None = None
    ) -> GitSha:
        """Commits what is staged (everything with ``all``); 409 when there is nothing to commit."""
        body: dict[str, Any] = {"path": path, "message": message, "all": all}
        if isinstance(author, GitAuthor):
            body["author"] = {"name": author.name, "email": author.email}
        elif author is not None:
            body["author"] = dict(author)
        return GitSha.model_validate(await self._json("POST", "/v1/git/commit", json_body=body))

    async def git_branches(self, path: str) -> GitBranches:
        return GitBranches.model_validate(await self._json("GET", "/v1/git/branches", params={"path": path}))

    async def git_checkout(self, path: str, branch: str, *, create: bool = False) -> GitCheckedOut:
        """Switches branch (creating it with ``create``); 409 when local changes would be lost."""
        body = {"path": path, "branch": branch, "create": create}
        return GitCheckedOut.model_validate(await self._json("POST", "/v1/git/checkout", json_body=body))

    async def list_worktrees(self, path: str) -> list[GitWorktree]:
        """The repository's work trees, the main one first."""
        body = await self._json("GET", "/v1/git/worktrees", params={"path": path})
        return [GitWorktree.model_validate(w) for w in body["worktrees"]]

    async def add_worktree(self, path: str, dest: str, branch: str, *, base: str | None = None) -> GitWorktree:
        """A new worktree on a new branch: a work tree of its own for one agent."""
        body: dict[str, Any] = {"path": path, "dest": dest, "branch": branch}
        if base is not None:
            body["base"] = base
        return GitWorktree.model_validate(await self._json("POST", "/v1/git/worktrees", json_body=body))

    async def remove_worktree(self, path: str, *, force: bool = False) -> None:
        """Removes a worktree; one with changes needs ``force`` (else 409)."""
        await self._send("DELETE", "/v1/git/worktrees", params={"path": path, "force": force})

    async def git_clone(
        self,
        url: str,
        dest: str,
        *,
        depth: int | None = None,
        branch: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> GitWorktree:
        """Clones into ``dest``. Over https, ``username`` + ``password`` (Basic) or ``password``
        alone (a Bearer token) are used for this clone only, never stored; a remote that refuses
        them is an ``HttpError`` with status 422 (not ``UnauthorizedError``, which is the
        daemon refusing the token)."""
        request = {"depth": depth, "branch": branch, "username": username, "password": password}
        body = {"url": url, "dest": dest, **{k: v for k, v in request.items() if v is not None}}
        return GitWorktree.model_validate(await self._json("POST", "/v1/git/clone", json_body=body))

    async def glob(self, path: str, pattern: str, *, hidden: bool | None = None, limit: int | None = None) -> GlobResult:
        """Files whose path matches a gitignore-style glob (absolute paths, sorted)."""
        params = {"path": path, "pattern": pattern, "hidden": hidden, "limit": limit}
        return GlobResult.model_validate(await self._json("GET", "/v1/fs/glob", params=params))

    async def grep(
        self,
        path: str,
        pattern: str,
        *,
        glob: str | None = None,
        ignore_case: bool | None = None,
        hidden: bool | None = None,
        limit: int | None = None,
    ) -> GrepResult:
        """Lines matching a regular expression (gitignore-aware, binary files skipped)."""
        params = {"path": path, "pattern": pattern, "glob": glob, "ignoreCase": ignore_case, "hidden": hidden, "limit": limit}
        return GrepResult.model_validate(await self._json("GET", "/v1/fs/grep", params=params))

    async def list_ports(self) -> list[PortInfo]:
        """The TCP listeners inside the sandbox (the daemon's own excluded)."""
        return [PortInfo.model_validate(p) for p in (await self._json("GET", "/v1/ports"))["ports"]]

    def port_proxy_url(self, port: int, path: str = "/") -> str:
        """The URL of ``path`` on ``port`` through the daemon's proxy (needs the token)."""
        return f"{self.base_url}/v1/ports/{int(port)}/proxy/{path.lstrip('/')}"

    async def create_preview(self, port: int, *, ttl: str | None = None) -> Preview:
        """A signed link to ``port`` that works without the token until it expires (``ttl``:
        ``10m``, ``2h``; default 1h). ``url`` is absolute here."""
        body = {} if ttl is None else {"ttl": ttl}
        p = Preview.model_validate(await self._json("POST", f"/v1/ports/{int(port)}/preview", json_body=body))
        return p.model_copy(update={"url": self.base_url + p.url})

    # -- processes -------------------------------------------------------------------------------

    async def get_process_config(self) -> ProcessConfig:
        return ProcessConfig.model_validate(await self._json("GET", "/v1/processes/config"))

    async def set_process_config(self, config: ProcessConfig) -> ProcessConfig:
        body = config.model_dump(by_alias=True)
        return ProcessConfig.model_validate(await self._json("POST", "/v1/processes/config", json_body=body))

    async def run_process(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
    ) -> ProcessRunResult:
        """Runs to completion (stdin closed, output captured up to a limit, killed at the timeout)."""
        body = _drop_none(
            {
                "command": command,
                "args": list(args),
                "cwd": cwd,
                "env": dict(env) if env is not None else None,
                "timeoutMs": timeout_ms,
                "maxOutputBytes": max_output_bytes,
            }
        )
        # The daemon answers when the process ends: no client timeout shorter than its own.
        t = httpx.Timeout(self._timeout, read=None)
        return ProcessRunResult.model_validate(await self._json("POST", "/v1/processes/run", json_body=body, timeout=t))

    async def create_process(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        tty: bool = False,
        interactive: bool = False,
        cols: int | None = None,
        rows: int | None = None,
    ) -> ProcessInfo:
        body = _drop_none(
            {
                "command": command,
                "args": list(args),
                "cwd": cwd,
                "env": dict(env) if env is not None else None,
                "tty": tty,
                "interactive": interactive,
                "cols": cols,
                "rows": rows,
            }
        )
        return ProcessInfo.model_validate(await self._json("POST", "/v1/processes", json_body=body))

    async def list_processes(self) -> list[ProcessInfo]:
        return [ProcessInfo.model_validate(p) for p in (await self._json("GET", "/v1/processes"))["processes"]]

    async def list_processes_page(self, *, limit: int | None = None, cursor: str | None = None) -> Page[ProcessInfo]:
        """One page of the process records, oldest first."""
        body = await self._json("GET", "/v1/processes", params={"limit": limit, "cursor": cursor})
        return Page([ProcessInfo.model_validate(p) for p in body["processes"]], body.get("nextCursor"))

    async def get_process(self, id: str) -> ProcessInfo:
        return ProcessInfo.model_validate(await self._json("GET", _proc(id)))

    async def delete_process(self, id: str) -> None:
        await self._send("DELETE", _proc(id))

    async def stop_process(self, id: str, *, wait_ms: int | None = None) -> ProcessInfo:
        """SIGTERM to the tree, the grace period, then SIGKILL; with ``wait_ms`` it answers once
        the process exited (or then)."""
        return ProcessInfo.model_validate(await self._json("POST", f"{_proc(id)}/stop", params={"waitMs": wait_ms}))

    async def kill_process(self, id: str, *, wait_ms: int | None = None) -> ProcessInfo:
        return ProcessInfo.model_validate(await self._json("POST", f"{_proc(id)}/kill", params={"waitMs": wait_ms}))

    async def get_process_logs(
        self, id: str, *, since: int | None = None, tail: int | None = None, stream: str | None = None
    ) -> ProcessLogs:
        raw = await self._json("GET", f"{_proc(id)}/logs", params={"since": since, "tail": tail, "stream": stream})
        raw["entries"] = [ProcessLogEntry.from_wire(e) for e in raw.get("entries", [])]
        return ProcessLogs.model_validate(raw)

    def follow_process_logs(
        self,
        id: str,
        *,
        since: int | None = None,
        tail: int | None = None,
        stream: str | None = None,
        on_gap: Callable[[Gap], Any] | None = None,
        idle_timeout: float = 45.0,
        reconnect_timeout: float = 60.0,
    ) -> LogStream:
        """Every log entry once, in order, across dropped connections, until the process exited:
        ``async with host.follow_process_logs(pid) as logs: async for entry in logs``."""
        return LogStream(self, id, since, tail, stream, on_gap, idle_timeout, reconnect_timeout)

    async def send_process_input(self, id: str, data: bytes | str) -> dict[str, Any]:
        """Writes to the process's stdin or terminal: bytes travel as base64, text as UTF-8."""
        if isinstance(data, str):
            body = {"data": data, "encoding": "utf8"}
        else:
            body = {"data": base64.b64encode(data).decode("ascii")}
        return dict(await self._json("POST", f"{_proc(id)}/input", json_body=body) or {})

    def connect_process_terminal(self, id: str) -> ProcessTerminal:
        """The process's terminal (``tty=True``) over its WebSocket: ``async with
        host.connect_process_terminal(id) as term``. Needs the ``[terminal]`` extra."""
        from .terminal import ProcessTerminal

        return ProcessTerminal(self, id)

    async def resize_process_terminal(self, id: str, cols: int, rows: int) -> dict[str, Any]:
        body = {"cols": cols, "rows": rows}
        return dict(await self._json("POST", f"{_proc(id)}/terminal/resize", json_body=body) or {})


_H = TypeVar("_H", bound=HostApi)


def _seg(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _proc(id: str) -> str:
    return f"/v1/processes/{_seg(id)}"


def _qv(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


def _range(r: str | None) -> dict[str, str] | None:
    if r is None:
        return None
    return {"Range": r if r.startswith("bytes=") else f"bytes={r}"}


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _body(data: Any) -> Any:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "__aiter__"):
        return data
    if hasattr(data, "read"):
        return _read_file_object(data)
    raise TypeError(f"cannot send a {type(data).__name__} as a body")


async def _read_file_object(f: IO[bytes]) -> AsyncIterator[bytes]:
    # One chunk at a time, read off the event loop (a file on a slow disk must not block it).
    while True:
        chunk = await asyncio.to_thread(f.read, _CHUNK)
        if not chunk:
            return
        yield chunk


class _Stream(AsyncIterator[T]):
    """Common shape: opened on ``__aenter__`` (or ``await open()``), closed by ``aclose()``."""

    _opened = False
    _closed = False

    async def open(self: _S) -> _S:
        if not self._opened:
            self._opened = True
            await self._open()
        return self

    async def _open(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self: _S) -> _S:
        return await self.open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self: _S) -> _S:
        return self

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError(f"{type(self).__name__} is not open: use `async with` (or `await s.open()`) first")


class ByteStream(_Stream[bytes]):
    """A file's bytes as they arrive; nothing is buffered beyond one chunk."""

    def __init__(
        self,
        host: HostApi,
        path: str,
        range: str | None,
        chunk_size: int,
        *,
        params: dict[str, Any] | None = None,
    ) -> None:
        """``params`` None: ``path`` is a file of the fs API; else the API path to GET."""
        self._host, self._path, self._range, self._chunk = host, path, range, chunk_size
        self._params = params
        self._res: httpx.Response | None = None
        self._it: AsyncIterator[bytes] | None = None
        self.status: int | None = None
        self.headers: httpx.Headers | None = None

    async def _open(self) -> None:
        if self._params is None:
            url, params = "/v1/fs/file", {"path": self._path}
        else:
            url, params = self._path, self._params
        self._res = await self._host._send("GET", url, params=params, headers=_range(self._range), stream=True)
        self.status, self.headers = self._res.status_code, self._res.headers
        self._it = self._res.aiter_bytes(self._chunk)

    async def __anext__(self) -> bytes:
        self._check_open()
        if self._it is None or self._closed:
            raise StopAsyncIteration
        try:
            return await self._it.__anext__()
        except httpx.TransportError as e:
            raise NetworkError(network_problem(self._path, e)) from e

    async def aclose(self) -> None:
        await super().aclose()
        if self._res is not None:
            await self._res.aclose()


class WatchStream(_Stream[WatchItem]):
    """``GET /v1/fs/watch`` followed across dropped connections (each reconnection is a
    ``WatchRescan(reason="reconnect")``)."""

    def __init__(self, host: HostApi, path: str, recursive: bool, ignore: tuple[str, ...], max_delay: float) -> None:
        self._host, self._path, self._recursive, self._ignore = host, path, recursive, ignore
        self._max_delay = max_delay
        self._res: httpx.Response | None = None
        self._events: AsyncIterator[Any] | None = None
        self._root: str | None = None
        self._connected = False
        self._done = False
        self.reconnects = 0

    async def _connect(self) -> None:
        params: dict[str, Any] = {"path": self._path, "recursive": self._recursive}
        if self._ignore:
            params["ignore"] = ",".join(self._ignore)
        self._res = await self._host._send(
            "GET",
            "/v1/fs/watch",
            params=params,
            headers={"Accept": "text/event-stream"},
            stream=True,
            timeout=httpx.Timeout(self._host._timeout, read=None),
        )
        self._events = parse_sse(self._res.aiter_raw(), 1 << 20)

    async def _open(self) -> None:
        await self._connect()

    async def _drop(self) -> None:
        if self._res is not None:
            await self._res.aclose()
        self._res, self._events = None, None

    async def _reconnect(self) -> None:
        delay = 0.1
        while not self._closed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_delay)
            try:
                await self._connect()
                self.reconnects += 1
                return
            except NetworkError:
                continue
            except HttpError as e:
                if 400 <= e.status < 500 and e.status not in (408, 429):
                    raise
                retry = e.problem.get("retryAfter")
                if isinstance(retry, (int, float)):
                    delay = max(delay, float(retry))

    async def __anext__(self) -> WatchItem:
        self._check_open()
        while not self._closed and not self._done:
            if self._events is None:
                await self._reconnect()
                continue
            try:
                ev = await self._events.__anext__()
            except (StopAsyncIteration, httpx.TransportError, SseEventTooLarge):
                await self._drop()
                continue
            if ev.event == "ready":
                self._root = json.loads(ev.data).get("path")
                first = not self._connected
                self._connected = True
                return WatchRescan(reason="start" if first else "reconnect")
            if ev.event == "change":
                change = WatchChange.model_validate_json(ev.data)
                if change.kind == "remove" and change.path == self._root:
                    self._done = True
                return change
            if ev.event == "overflow":
                return WatchRescan(reason="overflow", cause=json.loads(ev.data).get("reason"))
            if ev.event == "error":
                self._done = True
                raise http_error(json.loads(ev.data))
        await self._drop()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await super().aclose()
        await self._drop()


class LogStream(_Stream[ProcessLogEntry]):
    """A process's output log followed over SSE, resumed with ``Last-Event-ID`` (the last
    ``sequence``) after a drop; ends once the process exited."""

    def __init__(
        self,
        host: HostApi,
        id: str,
        since: int | None,
        tail: int | None,
        stream: str | None,
        on_gap: Callable[[Gap], Any] | None,
        idle_timeout: float,
        reconnect_timeout: float,
    ) -> None:
        self._host, self._id = host, id
        self._since, self._tail, self._stream = since, tail, stream
        self._on_gap = on_gap
        self._idle, self._reconnect_timeout = idle_timeout, reconnect_timeout
        self._res: httpx.Response | None = None
        self._events: AsyncIterator[Any] | None = None
        self._done = False
        self.last_sequence: int | None = None
        self.reconnects = 0

    async def _connect(self) -> None:
        params: dict[str, Any] = {"follow": True, "stream": self._stream}
        headers = {"Accept": "text/event-stream"}
        if self.last_sequence is not None:
            headers["Last-Event-ID"] = str(self.last_sequence)
        else:
            params["since"] = self._since
            params["tail"] = self._tail
        self._res = await self._host._send(
            "GET",
            f"{_proc(self._id)}/logs",
            params=params,
            headers=headers,
            stream=True,
            timeout=httpx.Timeout(self._host._timeout, read=self._idle),
        )
        self._events = parse_sse(self._res.aiter_raw(), 1 << 20)

    async def _open(self) -> None:
        await self._connect()

    async def _drop(self) -> None:
        if self._res is not None:
            await self._res.aclose()
        self._res, self._events = None, None

    async def _reconnect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reconnect_timeout
        delay = 0.1
        while not self._closed:
            try:
                await self._connect()
                self.reconnects += 1
                return
            except NetworkError:
                pass
            except HttpError as e:
                if 400 <= e.status < 500 and e.status not in (408, 429):
                    raise
            if loop.time() + delay > deadline:
                raise NetworkError(
                    {
                        "status": 0,
                        "title": "Network Error",
                        "detail": f"no log stream of process {self._id} for {self._reconnect_timeout} s",
                    }
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def __anext__(self) -> ProcessLogEntry:
        self._check_open()
        while not self._closed and not self._done:
            if self._events is None:
                await self._reconnect()
                continue
            try:
                ev = await self._events.__anext__()
            except StopAsyncIteration:
                await self._drop()
                # A clean end is believed only when the daemon says the process exited.
                if (await self._host.get_process(self._id)).status == "exited":
                    self._done = True
                continue
            except (httpx.TransportError, SseEventTooLarge):
                await self._drop()
                continue
            if ev.event == "gap":
                gap = Gap.model_validate_json(ev.data)
                if self._on_gap is not None:
                    await _call_maybe(self._on_gap, gap)
                else:
                    warnings.warn(
                        f"process {self._id}: output bytes {gap.from_}..{gap.to} were lost (gap)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                continue
            if ev.event != "log":
                continue
            entry = ProcessLogEntry.from_wire(json.loads(ev.data))
            if self.last_sequence is not None and entry.sequence <= self.last_sequence:
                continue
            self.last_sequence = entry.sequence
            return entry
        await self._drop()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await super().aclose()
        await self._drop()


