"""Local mode: start the ``sandbox-agent`` binary on this machine and connect to it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from collections.abc import Generator
from typing import IO, Any

import httpx

from .client import SandboxAgentClient
from .errors import StartError
from .sandbox import SandboxDetachedError, SandboxProvider, start_sandbox
from .sandbox import call as call_provider

__all__ = ["start_local", "SandboxAgent", "LocalStart"]

_TAIL = 4096


def _tail(f: IO[bytes] | None) -> str:
    if f is None:
        return ""
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - _TAIL))
        return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


class SandboxAgent(SandboxAgentClient):
    """A client of a daemon this process started; :meth:`dispose` (or leaving ``async with``)
    stops the daemon and reaps it."""

    def __init__(
        self,
        base_url: str,
        *,
        process: subprocess.Popen[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        stop_timeout: float = 15.0,
        **options: Any,
    ) -> None:
        super().__init__(base_url, **options)
        self._process = process
        self._stderr = stderr
        self._stop_timeout = stop_timeout
        self._provider: SandboxProvider | None = None
        self._raw_id: str | None = None

    @property
    def pid(self) -> int | None:
        """The local daemon's pid (``None`` for a daemon in a provider's sandbox)."""
        return self._process.pid if self._process is not None else None

    @classmethod
    def start(cls, **options: Any) -> Any:
        """Without ``sandbox``: :func:`start_local` (awaitable, or ``async with``). With
        ``sandbox=provider`` (and optionally ``sandbox_id``): a coroutine giving a client of the
        daemon in that provider's sandbox (see ``sandbox_agent.sandbox``)."""
        if "sandbox" in options:
            return start_sandbox(**options)
        return start_local(**options)

    def _attach(self, provider: SandboxProvider, raw_id: str) -> None:
        self._provider, self._raw_id = provider, raw_id

    @property
    def sandbox_id(self) -> str | None:
        """``name/raw id`` of the provider's sandbox (give it to a later ``start(sandbox_id=…)``)."""
        if self._provider is None or self._raw_id is None:
            return None
        return f"{self._provider.name}/{self._raw_id}"

    async def _end_sandbox(self, method: str) -> None:
        provider, raw = self._provider, self._raw_id
        if provider is None or raw is None:
            raise SandboxDetachedError("this client is not attached to a sandbox")
        self._provider = self._raw_id = None
        try:
            await self.disconnect()
        finally:
            if getattr(provider, method, None) is None:
                method = "destroy"
            await call_provider(provider, method, raw)

    async def destroy_sandbox(self) -> None:
        """Disconnects, then removes the sandbox for good (``destroy``)."""
        await self._end_sandbox("destroy")

    async def pause_sandbox(self) -> None:
        """Disconnects, then pauses the sandbox (``pause``; ``destroy`` when there is none)."""
        await self._end_sandbox("pause")

    async def kill_sandbox(self) -> None:
        """Disconnects, then deletes the sandbox at once (``kill``; else ``destroy``)."""
        await self._end_sandbox("kill")

    async def __aenter__(self) -> SandboxAgent:
        if not self.connected:
            await self.connect()
        return self

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        await self.dispose()

    def stderr_tail(self) -> str:
        return _tail(self._stderr)

    async def dispose(self) -> None:
        """Disconnects; a local daemon is then stopped (SIGTERM; SIGKILL after ``stop_timeout``)
        and reaped. A provider's sandbox keeps running (end it with ``destroy_sandbox()``)."""
        try:
            await self.disconnect()
        finally:
            try:
                await self.aclose()
            finally:
                if self._process is not None:
                    await _stop(self._process, self._stop_timeout)
                if self._stderr is not None:
                    self._stderr.close()


async def _stop(p: subprocess.Popen[bytes], timeout: float) -> None:
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while p.poll() is None and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if p.poll() is None:
        p.kill()
        await asyncio.to_thread(p.wait)


async def _start_local(
    *,
    binary_path: str = "sandbox-agent",
    port: int = 0,
    token: str | None = None,
    agent: str = "mock",
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    start_timeout: float = 30.0,
    stop_timeout: float = 15.0,
    connect: bool = True,
    **client_options: Any,
) -> SandboxAgent:
    """Starts ``sandbox-agent server --host 127.0.0.1 --port <port>`` and returns a connected
    :class:`SandboxAgent`. The address comes from the daemon's ``--ready-fd`` line; the token
    travels in the child's environment (``SANDBOX_AGENT_TOKEN``), never on its command line."""
    read_fd, write_fd = os.pipe()
    child_env = dict(os.environ if env is None else {**os.environ, **env})
    child_env.pop("SANDBOX_AGENT_TOKEN", None)
    if token:
        child_env["SANDBOX_AGENT_TOKEN"] = token
    child_env.pop("NOTIFY_SOCKET", None)
    stderr = tempfile.TemporaryFile()
    argv = [binary_path, "server", "--host", "127.0.0.1", "--port", str(port), "--ready-fd", str(write_fd), *args]
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=child_env,
            pass_fds=(write_fd,),
            start_new_session=False,
        )
    except OSError as e:
        os.close(read_fd)
        os.close(write_fd)
        stderr.close()
        raise StartError(f"cannot start {binary_path}: {e}") from e
    os.close(write_fd)

    async def fail(why: str) -> StartError:
        await _stop(process, 1.0)
        tail = _tail(stderr)
        stderr.close()
        return StartError(f"{binary_path} did not start: {why}", tail)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + start_timeout
    try:
        line = await asyncio.wait_for(asyncio.to_thread(_read_line, read_fd), timeout=start_timeout)
    except asyncio.TimeoutError:
        os.close(read_fd)
        raise await fail(f"no address within {start_timeout} s") from None
    if not line:
        raise await fail(f"it exited with {process.wait()} before listening")
    try:
        url = str(json.loads(line)["url"])
    except (ValueError, KeyError, TypeError):
        raise await fail(f"unexpected ready line {line!r}") from None

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=5.0, headers=headers) as http:
        while True:
            try:
                res = await http.get(f"{url}/v1/health")
                if res.status_code == 200:
                    break
                if res.status_code in (401, 403):
                    raise await fail(f"/v1/health answered {res.status_code}")
            except httpx.TransportError:
                pass
            if process.poll() is not None:
                raise await fail(f"it exited with {process.returncode}")
            if loop.time() > deadline:
                raise await fail(f"/v1/health did not answer within {start_timeout} s")
            await asyncio.sleep(0.05)

    sa = SandboxAgent(url, process=process, stderr=stderr, stop_timeout=stop_timeout, agent=agent, token=token,
                      **client_options)
    if connect:
        try:
            await sa.connect()
        except BaseException:
            await sa.dispose()
            raise
    return sa


def _read_line(fd: int) -> str:
    """The ready line (blocking; run in a thread). Empty when the daemon exited first."""
    out = bytearray()
    try:
        while not out.endswith(b"\n") and len(out) < 4096:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    return out.decode("utf-8", "replace").strip()


class LocalStart:
    """What :func:`start_local` returns: ``await`` it for the :class:`SandboxAgent`, or use it
    directly as ``async with start_local() as sa:`` (disposed on exit)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._sa: SandboxAgent | None = None

    def __await__(self) -> Generator[Any, None, SandboxAgent]:
        return _start_local(**self._options).__await__()

    async def __aenter__(self) -> SandboxAgent:
        self._sa = await _start_local(**self._options)
        return self._sa

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        if self._sa is not None:
            await self._sa.dispose()


def start_local(
    *,
    binary_path: str = "sandbox-agent",
    port: int = 0,
    token: str | None = None,
    agent: str = "mock",
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    start_timeout: float = 30.0,
    stop_timeout: float = 15.0,
    connect: bool = True,
    **client_options: Any,
) -> LocalStart:
    """Starts ``sandbox-agent server --host 127.0.0.1 --port <port>`` (``await start_local()``
    or ``async with start_local() as sa``) and gives a connected :class:`SandboxAgent`.

    The address comes from the daemon's ``--ready-fd`` line (never from its log); the token
    travels in the child's environment (``SANDBOX_AGENT_TOKEN``), never on its command line.
    ``connect=False`` starts the daemon without starting an agent. Failure: :class:`StartError`
    (with the daemon's ``stderr_tail``), the child killed and reaped."""
    return LocalStart(
        dict(
            binary_path=binary_path,
            port=port,
            token=token,
            agent=agent,
            args=args,
            env=env,
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
            connect=connect,
            **client_options,
        )
    )
