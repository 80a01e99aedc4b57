"""``SandboxAgentClient``: one agent instance (one server id) over the daemon's ACP endpoint,
plus every host API."""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import acp
from acp import schema
from acp.client.connection import ClientSideConnection

from . import __version__
from ._transport import HttpTransport, answer_box, warn_gap
from .errors import (
    AgentError,
    AlreadyConnectedError,
    HttpError,
    NotConnectedError,
    PermissionReplyError,
    UnsupportedError,
)
from .host import HostApi, _Stream
from .models import Gap
from .session_store import InMemorySessionStore, SessionRecord, SessionStore, now_iso

__all__ = [
    "SandboxAgentClient",
    "SessionUpdateEvent",
    "PermissionRequest",
    "NewSessionResult",
    "UpdateStream",
    "PermissionReply",
]

log = logging.getLogger("sandbox_agent")

ContentBlock = Union[
    schema.TextContentBlock,
    schema.ImageContentBlock,
    schema.AudioContentBlock,
    schema.ResourceContentBlock,
    schema.EmbeddedResourceContentBlock,
]
PermissionReply = Union[str, Mapping[str, Any], schema.RequestPermissionResponse, None]
UPDATES_WAIT = 5.0


@dataclass(frozen=True)
class SessionUpdateEvent:
    """One ``session/update`` of the agent, with the SSE event id it travelled under."""

    session_id: str
    update: Any  # one of acp.schema's session update models (AgentMessageChunk, ToolCallStart, …)
    server_id: str
    event_id: int | None


@dataclass(frozen=True)
class PermissionRequest:
    session_id: str
    tool_call: schema.ToolCallUpdate
    options: list[schema.PermissionOption]


@dataclass(frozen=True)
class NewSessionResult:
    session_id: str
    response: schema.NewSessionResponse
    record: SessionRecord


Callback = Callable[..., Any]


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class UpdateStream(_Stream[SessionUpdateEvent]):
    """Every update from its creation on (``session_id``: that session's only); ends when the
    connection ends or on ``aclose()``."""

    def __init__(self, client: SandboxAgentClient, session_id: str | None) -> None:
        self._client = client
        self.session_id = session_id
        self._queue: asyncio.Queue[SessionUpdateEvent | None] = asyncio.Queue()
        client._streams.add(self)
        self._opened = True

    async def _open(self) -> None:
        return None

    def _push(self, ev: SessionUpdateEvent | None) -> None:
        if ev is None or self.session_id is None or ev.session_id == self.session_id:
            self._queue.put_nowait(ev)

    async def __anext__(self) -> SessionUpdateEvent:
        if self._closed:
            raise StopAsyncIteration
        ev = await self._queue.get()
        if ev is None:
            self._closed = True
            raise StopAsyncIteration
        return ev

    async def aclose(self) -> None:
        await super().aclose()
        self._client._streams.discard(self)
        self._queue.put_nowait(None)


class _AcpClient:
    """What the ACP connection calls for the agent's requests."""

    def __init__(self, owner: SandboxAgentClient) -> None:
        self._owner = owner

    async def request_permission(
        self,
        options: list[schema.PermissionOption],
        session_id: str,
        tool_call: schema.ToolCallUpdate,
        **kwargs: Any,
    ) -> schema.RequestPermissionResponse:
        return await self._owner._answer_permission(PermissionRequest(session_id, tool_call, list(options)))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        # Updates are taken off the stream before the connection sees them; nothing comes here.
        self._owner._enqueue(None, SessionUpdateEvent(session_id, update, self._owner.server_id, None))

    def on_connect(self, conn: Any) -> None:
        return None


class SandboxAgentClient(HostApi):
    """One agent instance: ``async with SandboxAgentClient(url, agent="mock") as client``."""

    def __init__(
        self,
        base_url: str,
        *,
        agent: str,
        token: str | None = None,
        server_id: str | None = None,
        last_event_id: int | None = None,
        on_session_update: Callable[[SessionUpdateEvent], Any] | None = None,
        on_permission_request: Callable[[PermissionRequest], Any] | None = None,
        on_gap: Callable[[Gap], Any] | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
        session_store: SessionStore | None = None,
        wait_for_updates: bool = True,
        client_name: str = "sandbox-agent-python",
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        super().__init__(base_url, token=token, headers=headers, timeout=timeout)
        self._agent = agent
        self._server_id = server_id or f"sdk-{agent}-{uuid.uuid4()}"
        self._initial_last_event_id = last_event_id
        self.on_session_update = on_session_update
        self.on_permission_request = on_permission_request
        self.on_gap = on_gap
        self.on_error = on_error
        self.sessions: SessionStore = session_store or InMemorySessionStore()
        self.wait_for_updates = wait_for_updates
        self.client_name = client_name
        self._transport: HttpTransport | None = None
        self._conn: ClientSideConnection | None = None
        self._connecting = False
        self._agent_info: schema.InitializeResponse | None = None
        self._streams: set[UpdateStream] = set()
        self._dispatch_q: asyncio.Queue[tuple[int | None, SessionUpdateEvent | None] | None] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._delivered: int = last_event_id or 0
        self._delivered_cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cwd: str | None = None

    # -- properties --------------------------------------------------------------------------------

    @property
    def agent(self) -> str:
        return self._agent

    @property
    def server_id(self) -> str:
        return self._server_id

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._transport is not None and not self._transport.ended.is_set()

    @property
    def agent_info(self) -> schema.InitializeResponse | None:
        return self._agent_info

    @property
    def last_event_id(self) -> int | None:
        if self._transport is not None:
            return self._transport.last_event_id
        return self._initial_last_event_id

    # -- connection --------------------------------------------------------------------------------

    async def __aenter__(self) -> SandboxAgentClient:
        await self.connect()
        return self

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        try:
            await self.disconnect()
        finally:
            await self.aclose()

    async def connect(self) -> schema.InitializeResponse:
        """Starts (or re-attaches to) the agent instance and initializes it."""
        if self._conn is not None or self._connecting:
            raise AlreadyConnectedError(f"{self._server_id} is already connected or connecting")
        self._connecting = True
        try:
            self._delivered = self.last_event_id or 0
            self._delivered_cond = asyncio.Condition()
            self._dispatch_q = asyncio.Queue()
            self._dispatcher = asyncio.ensure_future(self._dispatch_loop(self._dispatch_q))
            transport = HttpTransport(
                self._http,
                self._server_id,
                self._agent,
                self.last_event_id,
                self._on_stream_event,
                self._report_gap,
                self._report_error,
            )
            self._transport = transport
            conn = acp.connect_to_agent(_AcpClient(self), transport)  # type: ignore[arg-type]
            self._conn = conn
            try:
                info: schema.InitializeResponse = await self._rpc(
                    conn.initialize(
                        protocol_version=acp.PROTOCOL_VERSION,
                        client_capabilities=schema.ClientCapabilities(),
                        client_info=schema.Implementation(name=self.client_name, version=__version__),
                    ),
                    "initialize",
                )
            except BaseException:
                # An instance the first POST started is deleted again (nothing is left running).
                await self._teardown()
                raise
            self._agent_info = info
            return self._agent_info
        finally:
            self._connecting = False

    async def disconnect(self, *, stop_agent: bool = True) -> None:
        """Closes the connection; ``stop_agent=True`` also deletes the instance (the daemon stops
        the agent), ``False`` leaves it running for a later re-attach (``server_id`` +
        ``last_event_id``)."""
        if self._conn is None or self._transport is None:
            return
        self._transport.delete_on_close = stop_agent
        last = self._transport.last_event_id
        await self._teardown()
        self._initial_last_event_id = None if stop_agent else last

    async def _teardown(self) -> None:
        conn, transport = self._conn, self._transport
        self._conn = None
        if conn is not None:
            try:
                await conn.close()
            except Exception as e:  # pragma: no cover - defensive
                log.debug("closing the ACP connection: %s", e)
        if transport is not None:
            await transport.close()
            self._initial_last_event_id = transport.last_event_id
        self._transport = None
        if self._dispatch_q is not None:
            self._dispatch_q.put_nowait(None)
        if self._dispatcher is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._dispatcher), timeout=UPDATES_WAIT)
            except asyncio.TimeoutError:
                self._dispatcher.cancel()
        self._dispatcher = None
        for s in list(self._streams):
            s._push(None)
        for t in list(self._tasks):
            t.cancel()

    # -- the stream: updates in order ------------------------------------------------------------

    def _on_stream_event(self, event_id: int | None, msg: dict[str, Any]) -> bool:
        if msg.get("method") == "session/update" and "id" not in msg:
            try:
                note = schema.SessionNotification.model_validate(msg.get("params") or {})
            except ValueError as e:
                self._report_error(e)
                self._enqueue(event_id, None)
                return True
            self._enqueue(event_id, SessionUpdateEvent(note.session_id, note.update, self._server_id, event_id))
            return True
        self._enqueue(event_id, None)
        return False

    def _enqueue(self, event_id: int | None, ev: SessionUpdateEvent | None) -> None:
        if self._dispatch_q is not None:
            self._dispatch_q.put_nowait((event_id, ev))

    async def _dispatch_loop(self, q: asyncio.Queue[tuple[int | None, SessionUpdateEvent | None] | None]) -> None:
        while True:
            item = await q.get()
            if item is None:
                return
            event_id, ev = item
            if ev is not None:
                for s in list(self._streams):
                    s._push(ev)
                if self.on_session_update is not None:
                    try:
                        await _maybe_await(self.on_session_update(ev))
                    except Exception as e:
                        self._report_error(e)
            if event_id is not None and self._delivered_cond is not None:
                async with self._delivered_cond:
                    self._delivered = max(self._delivered, event_id)
                    self._delivered_cond.notify_all()

    async def _wait_delivered(self, target: int) -> None:
        cond, transport = self._delivered_cond, self._transport
        if cond is None or transport is None:
            return

        async def reached() -> None:
            async with cond:
                await cond.wait_for(lambda: self._delivered >= target or transport.ended.is_set())

        ended = asyncio.ensure_future(transport.ended.wait())
        got = asyncio.ensure_future(reached())
        try:
            await asyncio.wait({ended, got}, timeout=UPDATES_WAIT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            got.cancel()

    def _report_gap(self, gap: Gap) -> None:
        if self.on_gap is None:
            warn_gap(self._server_id, gap)
            return
        self._spawn(self.on_gap, gap)

    def _report_error(self, error: BaseException) -> None:
        if self.on_error is None:
            log.error("sandbox-agent %s: %s", self._server_id, error)
            return
        self._spawn(self.on_error, error)

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        async def run() -> None:
            try:
                await _maybe_await(fn(*args))
            except Exception as e:  # a callback's own failure is logged, never raised
                log.exception("sandbox-agent callback failed: %s", e)

        t = asyncio.ensure_future(run())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- permissions -----------------------------------------------------------------------------

    async def _answer_permission(self, req: PermissionRequest) -> schema.RequestPermissionResponse:
        handler = self.on_permission_request
        if handler is None:
            return _default_permission(req)
        try:
            reply = await _maybe_await(handler(req))
        except Exception as e:
            self._report_error(e)
            return _default_permission(req)
        try:
            return _to_permission_response(reply, req)
        except PermissionReplyError as e:
            self._report_error(e)
            raise acp.RequestError.internal_error({"details": str(e)}) from e

    # -- session calls ---------------------------------------------------------------------------

    def _need(self) -> ClientSideConnection:
        if self._conn is None or self._transport is None:
            raise NotConnectedError(f"{self._server_id} is not connected: call connect() first")
        if self._transport.ended.is_set():
            reason = self._transport.end_reason
            raise NotConnectedError(f"{self._server_id}'s connection ended" + (f": {reason}" if reason else ""))
        return self._conn

    async def _rpc(self, call: Awaitable[Any], method: str) -> Any:
        try:
            return await call
        except acp.RequestError as e:
            if e.code == -32601:
                raise UnsupportedError(self._agent, method) from e
            raise AgentError(e.code, str(e), e.data) from e
        except ConnectionError as e:
            raise NotConnectedError(f"{self._server_id}: {e}") from e

    async def _default_cwd(self, cwd: str | None) -> str:
        if cwd is not None:
            return cwd
        if self._cwd is None:
            try:
                self._cwd = (await self.stat(".")).path
            except HttpError:
                self._cwd = "/"
        return self._cwd

    async def _touch(self, session_id: str) -> None:
        rec = await self.sessions.get(self._server_id, session_id)
        if rec is not None:
            rec.updated_at = now_iso()
            rec.last_event_id = self.last_event_id
            await self.sessions.set(rec)

    async def _record(self, session_id: str, title: str | None, metadata: Mapping[str, Any] | None) -> SessionRecord:
        now = now_iso()
        rec = SessionRecord(
            id=session_id,
            agent=self._agent,
            server_id=self._server_id,
            title=title,
            created_at=now,
            updated_at=now,
            last_event_id=self.last_event_id,
            metadata=dict(metadata) if metadata is not None else None,
        )
        await self.sessions.set(rec)
        return rec

    async def new_session(
        self,
        *,
        cwd: str | None = None,
        mcp_servers: Sequence[Any] | None = None,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> NewSessionResult:
        conn = self._need()
        resp: schema.NewSessionResponse = await self._rpc(
            conn.new_session(cwd=await self._default_cwd(cwd), mcp_servers=list(mcp_servers or [])),
            "session/new",
        )
        rec = await self._record(resp.session_id, title, metadata)
        return NewSessionResult(resp.session_id, resp, rec)

    async def prompt(self, session_id: str, prompt: str | Sequence[ContentBlock]) -> schema.PromptResponse:
        """Sends a prompt and returns the agent's answer once every update the agent wrote before
        it was delivered (to ``on_session_update`` and to open ``updates()`` streams)."""
        conn = self._need()
        blocks: list[Any] = (
            [schema.TextContentBlock(type="text", text=prompt)] if isinstance(prompt, str) else list(prompt)
        )
        box: list[int | None] = [None]
        token = answer_box.set(box)
        try:
            resp: schema.PromptResponse = await self._rpc(conn.prompt(session_id=session_id, prompt=blocks), "session/prompt")
        finally:
            answer_box.reset(token)
        if self.wait_for_updates:
            target = box[0]
            if target is None:
                # A daemon that does not name the event id: ask for the instance's last one.
                try:
                    for inst in await self.list_instances():
                        if inst.server_id == self._server_id:
                            target = inst.last_event_id
                except HttpError:
                    target = None
            if target:
                await self._wait_delivered(target)
        await self._touch(session_id)
        return resp

    async def cancel(self, session_id: str) -> None:
        """``session/cancel``: the running ``prompt()`` then returns ``stop_reason == "cancelled"``."""
        conn = self._need()
        await self._rpc(conn.cancel(session_id=session_id), "session/cancel")

    def _caps(self) -> schema.AgentCapabilities | None:
        return self._agent_info.agent_capabilities if self._agent_info else None

    async def load_session(
        self, session_id: str, *, cwd: str | None = None, mcp_servers: Sequence[Any] | None = None
    ) -> schema.LoadSessionResponse:
        conn = self._need()
        caps = self._caps()
        if not (caps and caps.load_session):
            raise UnsupportedError(self._agent, "session/load")
        resp: schema.LoadSessionResponse = await self._rpc(
            conn.load_session(
                cwd=await self._default_cwd(cwd), session_id=session_id, mcp_servers=list(mcp_servers or [])
            ),
            "session/load",
        )
        if await self.sessions.get(self._server_id, session_id) is None:
            await self._record(session_id, None, None)
        return resp

    async def resume_session(
        self, session_id: str, *, cwd: str | None = None, mcp_servers: Sequence[Any] | None = None
    ) -> schema.ResumeSessionResponse:
        conn = self._need()
        caps = self._caps()
        if not (caps and caps.session_capabilities and caps.session_capabilities.resume is not None):
            raise UnsupportedError(self._agent, "session/resume")
        resp: schema.ResumeSessionResponse = await self._rpc(
            conn.resume_session(
                session_id=session_id, cwd=await self._default_cwd(cwd), mcp_servers=list(mcp_servers or [])
            ),
            "session/resume",
        )
        return resp

    async def fork_session(
        self, session_id: str, *, cwd: str | None = None, mcp_servers: Sequence[Any] | None = None
    ) -> schema.ForkSessionResponse:
        conn = self._need()
        caps = self._caps()
        if not (caps and caps.session_capabilities and caps.session_capabilities.fork is not None):
            raise UnsupportedError(self._agent, "session/fork")
        resp: schema.ForkSessionResponse = await self._rpc(
            conn.fork_session(
                session_id=session_id, cwd=await self._default_cwd(cwd), mcp_servers=list(mcp_servers or [])
            ),
            "session/fork",
        )
        parent = await self.sessions.get(self._server_id, session_id)
        await self._record(resp.session_id, parent.title if parent else None, parent.metadata if parent else None)
        return resp

    async def list_sessions(self, **request: Any) -> schema.ListSessionsResponse:
        """ACP ``session/list``: the agent's own list where it advertises ``sessionCapabilities.list``,
        else the daemon's answer from its session inventory (this serverId's sessions)."""
        conn = self._need()
        resp: schema.ListSessionsResponse = await self._rpc(conn.list_sessions(**request), "session/list")
        return resp

    async def set_session_mode(self, session_id: str, mode_id: str) -> schema.SetSessionModeResponse:
        conn = self._need()
        resp: schema.SetSessionModeResponse = await self._rpc(
            conn.set_session_mode(session_id=session_id, mode_id=mode_id), "session/set_mode"
        )
        await self._touch(session_id)
        return resp

    async def set_session_model(self, session_id: str, model_id: str) -> Any:
        conn = self._need()
        result = await self._rpc(
            conn._conn.send_request("session/set_model", {"sessionId": session_id, "modelId": model_id}),
            "session/set_model",
        )
        await self._touch(session_id)
        return result

    async def set_session_config_option(
        self, *, session_id: str, config_id: str, value: str | bool
    ) -> schema.SetSessionConfigOptionResponse:
        conn = self._need()
        resp: schema.SetSessionConfigOptionResponse = await self._rpc(
            conn.set_config_option(config_id=config_id, session_id=session_id, value=value),
            "session/set_config_option",
        )
        await self._touch(session_id)
        return resp

    async def update_session(
        self, session_id: str, *, title: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> SessionRecord:
        """Edits the client-side record of a session (title, free JSON metadata)."""
        rec = await self.sessions.get(self._server_id, session_id)
        if rec is None:
            rec = await self._record(session_id, title, metadata)
        if title is not None:
            rec.title = title
        if metadata is not None:
            rec.metadata = dict(metadata)
        rec.updated_at = now_iso()
        await self.sessions.set(rec)
        return rec

    def updates(self, session_id: str | None = None) -> UpdateStream:
        """Every update from now on (of one session, or all): ``async with client.updates() as u:
        async for ev in u``. Registered at this call."""
        return UpdateStream(self, session_id)


def _default_permission(req: PermissionRequest) -> schema.RequestPermissionResponse:
    for o in req.options:
        if o.kind == "reject_once":
            return _selected(o.option_id)
    for o in req.options:
        if str(o.kind).startswith("reject"):
            return _selected(o.option_id)
    return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))


def _selected(option_id: str) -> schema.RequestPermissionResponse:
    return schema.RequestPermissionResponse(outcome=schema.AllowedOutcome(outcome="selected", option_id=option_id))


def _to_permission_response(reply: Any, req: PermissionRequest) -> schema.RequestPermissionResponse:
    offered = {o.option_id for o in req.options}
    if reply is None:
        return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))
    if isinstance(reply, schema.RequestPermissionResponse):
        out = reply.outcome
        if isinstance(out, schema.AllowedOutcome) and out.option_id not in offered:
            raise PermissionReplyError(reply, f"option {out.option_id!r} was not offered")
        return reply
    option_id: Any = reply
    if isinstance(reply, Mapping):
        option_id = reply.get("option_id", reply.get("optionId"))
    if not isinstance(option_id, str):
        raise PermissionReplyError(reply, "expected an option id, {'option_id': ...}, a RequestPermissionResponse or None")
    if option_id not in offered:
        raise PermissionReplyError(reply, f"option {option_id!r} was not offered ({sorted(offered)})")
    return _selected(option_id)
