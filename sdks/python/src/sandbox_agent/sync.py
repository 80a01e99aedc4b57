"""Blocking wrappers: the same classes and calls without ``await``, for scripts and notebooks.

Each wrapper runs its own asyncio event loop on a private daemon thread; calls are submitted to
it and waited for. Streams become plain context managers and iterators. Callbacks given to a
client run on that thread.

    from sandbox_agent.sync import start_local

    with start_local() as sa:
        s = sa.new_session()
        print(sa.prompt(s.session_id, "hello").stop_reason)
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from . import client as _client
from . import host as _host
from . import local as _local

__all__ = ["HostApi", "SandboxAgentClient", "SandboxAgent", "start_local", "SyncStream"]

T = TypeVar("T")
_END = object()


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandbox-agent-sync", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop.is_closed():
            raise RuntimeError("this sync wrapper was closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


def _is_stream(value: Any) -> bool:
    return hasattr(value, "__aenter__") and hasattr(value, "__anext__")


class SyncStream:
    """A stream of the async API as a context manager and an iterator."""

    def __init__(self, loop: _Loop, stream: Any) -> None:
        self._loop = loop
        self._stream = stream

    def __enter__(self) -> SyncStream:
        async def enter() -> None:
            await self._stream.__aenter__()

        self._loop.run(enter())
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(self._stream.aclose())

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        async def step() -> Any:
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return _END

        item = self._loop.run(step())
        if item is _END:
            raise StopIteration
        return item

    def __getattr__(self, name: str) -> Any:
        return _wrap_attr(self._loop, getattr(self._stream, name))


def _wrap_attr(loop: _Loop, attr: Any) -> Any:
    if inspect.iscoroutinefunction(attr):

        def call(*args: Any, **kwargs: Any) -> Any:
            return loop.run(attr(*args, **kwargs))

        call.__doc__ = attr.__doc__
        return call
    if callable(attr) and not isinstance(attr, type):

        def call_sync(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            return SyncStream(loop, result) if _is_stream(result) else result

        call_sync.__doc__ = attr.__doc__
        return call_sync
    return attr


class _Wrapper:
    _loop: _Loop
    _inner: Any

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _wrap_attr(self._loop, getattr(self._inner, name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_loop", "_inner"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)


def _make(factory: Callable[[], T]) -> tuple[_Loop, T]:
    loop = _Loop()

    async def build() -> T:
        return factory()

    try:
        return loop, loop.run(build())
    except BaseException:
        loop.stop()
        raise


class HostApi(_Wrapper):
    """``sandbox_agent.HostApi`` without ``await``; ``close()`` (or ``with``) ends it."""

    def __init__(self, base_url: str, **options: Any) -> None:
        loop, inner = _make(lambda: _host.HostApi(base_url, **options))
        self._loop, self._inner = loop, inner

    def close(self) -> None:
        try:
            self._loop.run(self._inner.aclose())
        finally:
            self._loop.stop()

    def __enter__(self) -> HostApi:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class SandboxAgentClient(HostApi):
    """``sandbox_agent.SandboxAgentClient`` without ``await``: ``with`` connects and, on exit,
    disconnects and closes."""

    def __init__(self, base_url: str, **options: Any) -> None:
        loop, inner = _make(lambda: _client.SandboxAgentClient(base_url, **options))
        self._loop, self._inner = loop, inner

    def __enter__(self) -> SandboxAgentClient:
        self._loop.run(self._inner.connect())
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._loop.run(self._inner.disconnect())
        finally:
            self.close()


class SandboxAgent(SandboxAgentClient):
    """A started local daemon (see :func:`start_local`); ``dispose()`` or leaving ``with`` stops it."""

    def __init__(self, loop: _Loop, inner: _local.SandboxAgent) -> None:  # noqa: D107
        self._loop, self._inner = loop, inner

    def __enter__(self) -> SandboxAgent:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.dispose()

    def dispose(self) -> None:
        try:
            self._loop.run(self._inner.dispose())
        finally:
            self._loop.stop()


def start_local(**options: Any) -> SandboxAgent:
    """``sandbox_agent.start_local`` without ``await`` (same arguments)."""
    loop = _Loop()

    async def start() -> _local.SandboxAgent:
        return await _local.start_local(**options)

    try:
        inner = loop.run(start())
    except BaseException:
        loop.stop()
        raise
    return SandboxAgent(loop, inner)
