"""A process's terminal over its WebSocket (``GET /v1/processes/{id}/terminal/ws``). Needs the
optional ``websockets`` package (``pip install 'sandbox-agent[terminal]'``)."""

from __future__ import annotations

import base64
import json
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import HttpError, NetworkError, http_error, network_problem, problem_from_body

if TYPE_CHECKING:
    from .host import HostApi

__all__ = ["ProcessTerminal"]


class ProcessTerminal:
    """``async with host.connect_process_terminal(id) as term``: ``send_input``, ``resize``,
    ``async for chunk in term`` (raw output bytes) until the process's ``exit`` frame."""

    def __init__(self, host: HostApi, process_id: str) -> None:
        self._host = host
        self.process_id = process_id
        self._ws: Any = None
        self.exit_code: int | None = None
        self.exit_signal: int | None = None
        self.exited = False

    async def open(self) -> ProcessTerminal:
        try:
            from websockets.asyncio.client import connect
            from websockets.exceptions import InvalidStatus
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "the process terminal needs the `websockets` package: pip install 'sandbox-agent[terminal]'"
            ) from e
        from urllib.parse import quote

        base = self._host.base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        url = f"{base}/v1/processes/{quote(self.process_id, safe='')}/terminal/ws"
        try:
            self._ws = await connect(
                url, additional_headers=self._host._headers, proxy=None, compression=None, max_size=16 << 20
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
        return self

    async def send_input(self, data: str | bytes) -> None:
        """Text is written as it is, bytes as base64 (every byte exact)."""
        if isinstance(data, str):
            frame = {"type": "input", "data": data}
        else:
            frame = {"type": "input", "data": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
        await self._ws.send(json.dumps(frame))

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def __aiter__(self) -> ProcessTerminal:
        return self

    async def __anext__(self) -> bytes:
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise RuntimeError("ProcessTerminal is not open: use `async with` first")
        while not self.exited:
            try:
                frame = await self._ws.recv()
            except ConnectionClosed:
                break
            if isinstance(frame, bytes):
                return frame
            msg = json.loads(frame)
            if msg.get("type") == "exit":
                self.exited = True
                self.exit_code = msg.get("exitCode")
                self.exit_signal = msg.get("signal")
            elif msg.get("type") == "error":
                raise HttpError({"status": 0, "title": "Terminal Error", "detail": str(msg.get("message"))})
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def __aenter__(self) -> ProcessTerminal:
        return await self.open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
