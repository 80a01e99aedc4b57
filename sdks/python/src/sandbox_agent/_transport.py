"""One agent instance's ACP over HTTP, as the message-level transport ``acp.Connection`` takes:
every outgoing message is one ``POST /v1/acp/{serverId}``; incoming messages are POST answers and
the events of one SSE reader (``GET``), resumed with ``Last-Event-ID`` after any drop."""

from __future__ import annotations

import asyncio
import contextvars
import json
import warnings
from collections.abc import Callable
from typing import Any

import httpx

from ._sse import SseEventTooLarge, parse_sse
from .errors import HttpError, NetworkError, NotConnectedError, http_error, network_problem, problem_from_body
from .models import Gap

# Set by a caller that wants the `Sandbox-Agent-Last-Event-Id` of its request's answer: a
# one-element list the transport fills (the POST runs in the caller's context).
answer_box: contextvars.ContextVar[list[int | None] | None] = contextvars.ContextVar("answer_box", default=None)

INFLIGHT_AT_END = 5.0


class HttpTransport:
    def __init__(
        self,
        http: httpx.AsyncClient,
        server_id: str,
        agent: str | None,
        last_event_id: int | None,
        on_event: Callable[[int | None, dict[str, Any]], bool],
        on_gap: Callable[[Gap], None],
        on_error: Callable[[BaseException], None],
        *,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        idle_timeout: float = 45.0,
        max_event_bytes: int = 64 << 20,
        close_timeout: float = 2.0,
    ) -> None:
        self._http = http
        self.path = f"/v1/acp/{server_id}"
        self._agent = agent
        self.last_event_id = last_event_id
        self._on_event = on_event
        self._on_gap = on_gap
        self._on_error = on_error
        self._initial, self._max = reconnect_initial, reconnect_max
        self._idle, self._max_event, self._close_timeout = idle_timeout, max_event_bytes, close_timeout
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._bootstrapped = False
        self._sse: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._inflight: set[asyncio.Task[Any]] = set()
        self.delete_on_close = True
        self.end_reason: HttpError | None = None
        self.ended = asyncio.Event()
        self.reconnects = 0
        self._id_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- acp Transport protocol --------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            raise NotConnectedError("the connection is closed")
        is_request = isinstance(message.get("method"), str) and message.get("id") is not None
        post = asyncio.ensure_future(self._post(message, is_request))
        self._inflight.add(post)
        post.add_done_callback(self._inflight.discard)
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({post, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not post.done() or post.cancelled():
            post.cancel()
            raise NotConnectedError("disconnected while the request was in flight")
        exc = post.exception()
        if exc is not None and not is_request and "method" not in message:
            # A response to the agent's request (a permission answer) that did not arrive.
            self._on_error(exc)
            return
        post.result()

    async def receive(self) -> dict[str, Any] | None:
        return await self._queue.get()

    async def close(self) -> None:
        if self.closed:
            return
        self._closed.set()
        if self._sse is not None:
            self._sse.cancel()
        for t in list(self._inflight):
            t.cancel()
        if self._bootstrapped and self.delete_on_close:
            try:
                await self._http.delete(self.path, timeout=self._close_timeout)
            except httpx.HTTPError:
                pass
        self._finish()

    # -- outgoing --------------------------------------------------------------------------------

    async def _post(self, message: dict[str, Any], is_request: bool) -> None:
        params = {"agent": self._agent} if not self._bootstrapped and self._agent else None
        # A request may take as long as the agent takes (a prompt: minutes); the daemon bounds
        # it (--request-timeout, 504).
        timeout = httpx.Timeout(30.0, read=None) if is_request else httpx.Timeout(30.0)
        url = self._http.base_url.join(self.path)
        try:
            res = await self._http.post(
                self.path,
                params=params,
                content=json.dumps(message, separators=(",", ":")).encode(),
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                timeout=timeout,
            )
        except httpx.TransportError as e:
            raise NetworkError(network_problem(str(url), e)) from e
        if not res.is_success:
            raise http_error(
                problem_from_body(res.status_code, res.content, res.headers.get("content-type", ""), str(url))
            )
        self._mark_bootstrapped()
        if res.status_code == 200 and res.content.strip():
            box = answer_box.get()
            if box is not None:
                named = res.headers.get("sandbox-agent-last-event-id", "")
                box[0] = int(named) if named.isdigit() else None
            answer = json.loads(res.content)
            if isinstance(answer, dict):
                self._queue.put_nowait(answer)

    def _mark_bootstrapped(self) -> None:
        self._bootstrapped = True
        if self._sse is None and not self.closed:
            self._sse = asyncio.ensure_future(self._sse_loop())

    # -- incoming --------------------------------------------------------------------------------

    async def _sse_loop(self) -> None:
        delay = self._initial
        first = True
        try:
            while not self.closed:
                if not first:
                    self.reconnects += 1
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._max)
                first = False
                headers = {"Accept": "text/event-stream"}
                if self.last_event_id is not None:
                    headers["Last-Event-ID"] = str(self.last_event_id)
                try:
                    req = self._http.build_request(
                        "GET", self.path, headers=headers, timeout=httpx.Timeout(30.0, read=self._idle)
                    )
                    res = await self._http.send(req, stream=True)
                except httpx.TransportError:
                    continue
                try:
                    if not res.is_success:
                        body = await res.aread()
                        problem = problem_from_body(
                            res.status_code, body, res.headers.get("content-type", ""), str(req.url)
                        )
                        if res.status_code in (404, 410):
                            self.end_reason = http_error(problem)
                            await self._end_after_inflight()
                            return
                        if 400 <= res.status_code < 500 and res.status_code not in (408, 429):
                            self.end_reason = http_error(problem)
                            self._on_error(self.end_reason)
                            self._finish()
                            return
                        continue
                    async for ev in parse_sse(res.aiter_raw(), self._max_event):
                        if ev.event == "gap":
                            try:
                                gap = Gap.model_validate_json(ev.data)
                            except ValueError:
                                gap = Gap.model_validate({"from": -1, "to": -1})
                            self._on_gap(gap)
                            continue
                        if ev.event != "message":
                            continue
                        ev_id = int(ev.id) if ev.id is not None and ev.id.isdigit() else None
                        if ev_id is not None:
                            if self.last_event_id is not None and ev_id <= self.last_event_id:
                                continue  # already seen (never expected; a duplicate is dropped)
                            self.last_event_id = ev_id
                        delay = self._initial
                        try:
                            msg = json.loads(ev.data)
                        except ValueError:
                            self._on_error(ValueError(f"event {ev.id} is not JSON; skipped"))
                            continue
                        if isinstance(msg, dict) and not self._on_event(ev_id, msg):
                            self._queue.put_nowait(msg)
                        self._wake(ev_id)
                except (httpx.TransportError, httpx.StreamError):
                    continue
                except SseEventTooLarge as e:
                    self._on_error(e)
                    self._finish()
                    return
                finally:
                    await res.aclose()
        except asyncio.CancelledError:
            return
        except Exception as e:  # never a silent, dead reader: the connection ends and says why
            self._on_error(e)
            self._finish()

    async def _end_after_inflight(self) -> None:
        # The POSTs still waiting get their own answers (a 502 with the exit code) first.
        pending = [t for t in self._inflight if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=INFLIGHT_AT_END)
        self._finish()

    def _finish(self) -> None:
        if self.ended.is_set():
            return
        self.ended.set()
        self._queue.put_nowait(None)
        for _, fut in self._id_waiters:
            if not fut.done():
                fut.set_result(None)
        self._id_waiters.clear()

    def _wake(self, ev_id: int | None) -> None:
        if ev_id is None or not self._id_waiters:
            return
        keep = []
        for n, fut in self._id_waiters:
            if n <= ev_id:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((n, fut))
        self._id_waiters = keep


def warn_gap(server_id: str, gap: Gap) -> None:
    warnings.warn(f"{server_id}: events {gap.from_}..{gap.to} were lost (gap)", RuntimeWarning, stacklevel=2)
