"""The desktop (``/v1/desktop/*``): ``host.desktop`` has one method per route, and
``connect_live_view`` opens the live view WebSocket (``/v1/desktop/stream/frames``): JPEG frames
in, pointer and keyboard input out. Every non-2xx answer raises the matching :class:`HttpError`
(409 before ``start``, 400 naming the ``field``, 503 naming a missing Debian ``package``)."""

from __future__ import annotations

import json
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlencode

from pydantic import Field

from .errors import HttpError, NetworkError, http_error, network_problem, problem_from_body
from .models import Model

if TYPE_CHECKING:
    from .host import HostApi

__all__ = [
    "DesktopApi",
    "DesktopLiveView",
    "DesktopStatus",
    "DesktopResolution",
    "DesktopDisplayInfo",
    "DesktopMousePosition",
    "DesktopWindow",
    "DesktopClipboard",
    "DesktopLaunchResult",
    "DesktopRecording",
]

_P = "/v1/desktop"
Button = Literal["left", "middle", "right"]


class DesktopResolution(Model):
    width: int
    height: int
    dpi: int | None = None


class DesktopStatus(Model):
    """``state``: ``inactive``, ``install_required``, ``starting``, ``active``, ``stopping`` or ``failed``."""

    state: str
    display: str | None = None
    resolution: DesktopResolution | None = None
    started_at: str | None = None
    last_error: dict[str, Any] | None = None
    missing_dependencies: list[str] = Field(default_factory=list)
    install_command: str | None = None
    processes: list[dict[str, Any]] = Field(default_factory=list)


class DesktopDisplayInfo(Model):
    display: str
    resolution: DesktopResolution


class DesktopMousePosition(Model):
    x: int
    y: int
    screen: int | None = None
    window: str | None = None


class DesktopWindow(Model):
    id: str
    title: str = ""
    x: int
    y: int
    width: int
    height: int
    is_active: bool = False


class DesktopClipboard(Model):
    selection: str
    text: str


class DesktopLaunchResult(Model):
    process_id: str
    pid: int | None = None
    window_id: str | None = None


class DesktopRecording(Model):
    """``status``: ``recording``, ``completed`` or ``failed``."""

    id: str
    file_name: str | None = None
    bytes: int = 0
    started_at: str | None = None
    ended_at: str | None = None
    status: str
    process_id: str | None = None


def _body(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _win(id: str | int) -> str:
    return f"{_P}/windows/{quote(str(id), safe='')}"


def _rec(id: str) -> str:
    return f"{_P}/recordings/{quote(id, safe='')}"


class DesktopApi:
    """``host.desktop``: the desktop routes (docs/desktop.md of the daemon)."""

    def __init__(self, host: HostApi) -> None:
        self._host = host

    async def _j(self, method: str, path: str, **kw: Any) -> Any:
        return await self._host._json(method, path, **kw)

    async def status(self) -> DesktopStatus:
        return DesktopStatus.model_validate(await self._j("GET", f"{_P}/status"))

    async def start(
        self,
        *,
        display_num: int | None = None,
        width: int | None = None,
        height: int | None = None,
        dpi: int | None = None,
    ) -> DesktopStatus:
        body = _body(displayNum=display_num, width=width, height=height, dpi=dpi)
        return DesktopStatus.model_validate(await self._j("POST", f"{_P}/start", json_body=body))

    async def stop(self) -> DesktopStatus:
        return DesktopStatus.model_validate(await self._j("POST", f"{_P}/stop"))

    async def display_info(self) -> DesktopDisplayInfo:
        return DesktopDisplayInfo.model_validate(await self._j("GET", f"{_P}/display/info"))

    async def screenshot(
        self,
        *,
        format: Literal["png", "jpeg", "webp"] | None = None,
        quality: int | None = None,
        scale: float | None = None,
        show_cursor: bool | None = None,
    ) -> bytes:
        """The whole screen as image bytes (PNG unless ``format`` says otherwise)."""
        q = _body(format=format, quality=quality, scale=scale, showCursor=show_cursor)
        return (await self._host._send("GET", f"{_P}/screenshot", params=q)).content

    async def screenshot_region(
        self,
        x: int,
        y: int,
        width: int,
        height: int,
        *,
        format: Literal["png", "jpeg", "webp"] | None = None,
        quality: int | None = None,
        scale: float | None = None,
        show_cursor: bool | None = None,
    ) -> bytes:
        """A region wholly on the screen (else 400)."""
        q = _body(x=x, y=y, width=width, height=height, format=format, quality=quality, scale=scale,
                  showCursor=show_cursor)
        return (await self._host._send("GET", f"{_P}/screenshot/region", params=q)).content

    async def _mouse(self, what: str, body: dict[str, Any] | None = None) -> DesktopMousePosition:
        method = "GET" if body is None else "POST"
        return DesktopMousePosition.model_validate(await self._j(method, f"{_P}/mouse/{what}", json_body=body))

    async def mouse_position(self) -> DesktopMousePosition:
        return await self._mouse("position")

    async def mouse_move(self, x: int, y: int) -> DesktopMousePosition:
        return await self._mouse("move", {"x": x, "y": y})

    async def mouse_click(
        self, x: int, y: int, *, button: Button | None = None, click_count: int | None = None
    ) -> DesktopMousePosition:
        return await self._mouse("click", _body(x=x, y=y, button=button, clickCount=click_count))

    async def mouse_down(
        self, x: int | None = None, y: int | None = None, *, button: Button | None = None
    ) -> DesktopMousePosition:
        return await self._mouse("down", _body(x=x, y=y, button=button))

    async def mouse_up(
        self, x: int | None = None, y: int | None = None, *, button: Button | None = None
    ) -> DesktopMousePosition:
        return await self._mouse("up", _body(x=x, y=y, button=button))

    async def mouse_drag(
        self, start_x: int, start_y: int, end_x: int, end_y: int, *, button: Button | None = None
    ) -> DesktopMousePosition:
        body = _body(startX=start_x, startY=start_y, endX=end_x, endY=end_y, button=button)
        return await self._mouse("drag", body)

    async def mouse_scroll(
        self, x: int, y: int, *, delta_x: int | None = None, delta_y: int | None = None
    ) -> DesktopMousePosition:
        return await self._mouse("scroll", _body(x=x, y=y, deltaX=delta_x, deltaY=delta_y))

    async def type_text(self, text: str, *, delay_ms: int | None = None) -> None:
        """Types any Unicode text (at most 64 KiB)."""
        await self._j("POST", f"{_P}/keyboard/type", json_body=_body(text=text, delayMs=delay_ms))

    async def press_key(self, key: str, *, modifiers: dict[str, bool] | None = None) -> None:
        """An X keysym name (``Return``, ``a``, ``F5``) with optional ``ctrl``/``shift``/``alt``/``cmd``; 400 for an unknown name."""
        await self._j("POST", f"{_P}/keyboard/press", json_body=_body(key=key, modifiers=modifiers))

    async def key_down(self, key: str) -> None:
        await self._j("POST", f"{_P}/keyboard/down", json_body={"key": key})

    async def key_up(self, key: str) -> None:
        await self._j("POST", f"{_P}/keyboard/up", json_body={"key": key})

    async def list_windows(self) -> list[DesktopWindow]:
        return [DesktopWindow.model_validate(w) for w in (await self._j("GET", f"{_P}/windows"))["windows"]]

    async def focused_window(self) -> DesktopWindow:
        """The focused window (``NotFoundError`` when none)."""
        return DesktopWindow.model_validate(await self._j("GET", f"{_P}/windows/focused"))

    async def focus_window(self, id: str | int) -> DesktopWindow:
        return DesktopWindow.model_validate(await self._j("POST", f"{_win(id)}/focus"))

    async def move_window(self, id: str | int, x: int, y: int) -> DesktopWindow:
        return DesktopWindow.model_validate(await self._j("POST", f"{_win(id)}/move", json_body={"x": x, "y": y}))

    async def resize_window(self, id: str | int, width: int, height: int) -> DesktopWindow:
        body = {"width": width, "height": height}
        return DesktopWindow.model_validate(await self._j("POST", f"{_win(id)}/resize", json_body=body))

    async def get_clipboard(self, selection: str | None = None) -> DesktopClipboard:
        raw = await self._j("GET", f"{_P}/clipboard", params=_body(selection=selection))
        return DesktopClipboard.model_validate(raw)

    async def set_clipboard(self, text: str, *, selection: str | None = None) -> None:
        await self._j("POST", f"{_P}/clipboard", json_body=_body(text=text, selection=selection))

    async def launch(self, app: str, args: list[str] | None = None, *, wait: bool | None = None) -> DesktopLaunchResult:
        """Starts a program on the desktop; with ``wait``, answers once its window exists (≤ 10 s)."""
        raw = await self._j("POST", f"{_P}/launch", json_body=_body(app=app, args=args, wait=wait))
        return DesktopLaunchResult.model_validate(raw)

    async def open(self, target: str) -> DesktopLaunchResult:
        return DesktopLaunchResult.model_validate(await self._j("POST", f"{_P}/open", json_body={"target": target}))

    async def start_recording(self, *, fps: int | None = None) -> DesktopRecording:
        raw = await self._j("POST", f"{_P}/recording/start", json_body=_body(fps=fps))
        return DesktopRecording.model_validate(raw)

    async def stop_recording(self) -> DesktopRecording:
        return DesktopRecording.model_validate(await self._j("POST", f"{_P}/recording/stop"))

    async def list_recordings(self) -> list[DesktopRecording]:
        raw = await self._j("GET", f"{_P}/recordings")
        return [DesktopRecording.model_validate(r) for r in raw["recordings"]]

    async def get_recording(self, id: str) -> DesktopRecording:
        return DesktopRecording.model_validate(await self._j("GET", _rec(id)))

    async def download_recording(self, id: str) -> bytes:
        """The MP4's bytes (409 while it is still recording)."""
        return (await self._host._send("GET", f"{_rec(id)}/download")).content

    async def delete_recording(self, id: str) -> None:
        await self._host._send("DELETE", _rec(id))

    async def stream_status(self) -> dict[str, Any]:
        """The reference's WebRTC stream: always ``{"active": False}`` (use :meth:`connect_live_view`)."""
        return await self._j("GET", f"{_P}/stream/status")  # type: ignore[no-any-return]

    def connect_live_view(
        self, *, fps: int | None = None, quality: int | None = None, scale: float | None = None
    ) -> DesktopLiveView:
        """``async with host.desktop.connect_live_view(fps=4) as view``: ``view.width``/``height``,
        ``async for jpeg in view`` (ends when the desktop stops), ``await view.move(x, y)`` etc."""
        return DesktopLiveView(self._host, _body(fps=fps, quality=quality, scale=scale))


class DesktopLiveView:
    """The live view socket. Needs the optional ``websockets`` package (``sandbox-agent[terminal]``).
    Input the daemon refuses is collected in ``errors`` (the session goes on); the ``end``
    message (desktop stopped or failed) ends the iteration, its text in ``end_message``."""

    def __init__(self, host: HostApi, query: dict[str, Any]) -> None:
        self._host = host
        self._query = query
        self._ws: Any = None
        self.width = 0
        self.height = 0
        self.frames = 0
        self.errors: list[str] = []
        self.end_message: str | None = None

    async def open(self) -> DesktopLiveView:
        try:
            from websockets.asyncio.client import connect
            from websockets.exceptions import InvalidStatus
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError("the live view needs the `websockets` package: pip install 'sandbox-agent[terminal]'") from e
        base = self._host.base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        url = f"{base}{_P}/stream/frames"
        if self._query:
            url += "?" + urlencode(self._query)
        try:
            self._ws = await connect(
                url, additional_headers=self._host._headers, proxy=None, compression=None, max_size=64 << 20
            )
        except InvalidStatus as e:
            res = e.response
            raise http_error(
                problem_from_body(res.status_code, bytes(res.body or b""), res.headers.get("content-type", ""), url)
            ) from e
        except OSError as e:
            raise NetworkError(network_problem(url, e)) from e
        first = json.loads(await self._ws.recv())
        if first.get("type") != "ready":
            await self._ws.close()
            raise HttpError({"status": 0, "title": "Unexpected Frame", "detail": f"expected ready, got {first!r}"})
        self.width, self.height = int(first["width"]), int(first["height"])
        return self

    async def send(self, message: dict[str, Any]) -> None:
        if self._ws is None:
            raise RuntimeError("DesktopLiveView is not open: use `async with` first")
        await self._ws.send(json.dumps(message))

    async def move(self, x: int, y: int) -> None:
        await self.send({"type": "move", "x": x, "y": y})

    async def click(self, x: int, y: int, button: Button | None = None) -> None:
        await self.send(_body(type="click", x=x, y=y, button=button))

    async def scroll(self, x: int, y: int, delta_y: int, delta_x: int = 0) -> None:
        await self.send({"type": "scroll", "x": x, "y": y, "deltaX": delta_x, "deltaY": delta_y})

    async def type_text(self, text: str) -> None:
        await self.send({"type": "type", "text": text})

    async def key(self, key: str) -> None:
        await self.send({"type": "key", "key": key})

    def __aiter__(self) -> DesktopLiveView:
        return self

    async def __anext__(self) -> bytes:
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise RuntimeError("DesktopLiveView is not open: use `async with` first")
        while self.end_message is None:
            try:
                frame = await self._ws.recv()
            except ConnectionClosed:
                break
            if isinstance(frame, bytes):
                self.frames += 1
                return frame
            msg = json.loads(frame)
            if msg.get("type") == "error":
                self.errors.append(str(msg.get("message")))
            elif msg.get("type") == "end":
                self.end_message = str(msg.get("message") or "")
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def __aenter__(self) -> DesktopLiveView:
        return await self.open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
