"""Fixtures: the real daemon (``SANDBOX_AGENT_BIN``, default ``../../target/debug/sandbox-agent``)
on 127.0.0.1:0 with private data and work dirs, driving the built-in ``mock`` agent."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox_agent import SandboxAgent, start_local

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
BIN = os.environ.get("SANDBOX_AGENT_BIN", str(REPO / "target" / "debug" / "sandbox-agent"))


@pytest.fixture
def binary() -> str:
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"no daemon binary at {BIN} (build it, or set SANDBOX_AGENT_BIN)")
    return BIN


async def start_daemon(binary: str, tmp: Path, *extra: str, token: str | None = None) -> SandboxAgent:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    return await start_local(
        binary_path=binary,
        token=token,
        connect=False,
        args=["--data-dir", str(tmp / "data"), "--work-dir", str(work), *extra],
    )


@pytest.fixture
async def daemon(binary: str, tmp_path: Path) -> AsyncIterator[SandboxAgent]:
    """A daemon (not connected to any agent); its ``base_url`` serves every test client."""
    sa = await start_daemon(binary, tmp_path)
    try:
        yield sa
    finally:
        await sa.dispose()


class CutProxy:
    """A loopback TCP proxy. Streams (GET requests) can be cut after ``cut_after`` bytes went
    to the client, ``cuts`` times, and delayed by ``delay`` seconds per chunk."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.cut_after: int | None = None
        self.cuts = 0
        self.cut_done = 0
        self.delay = 0.0
        self.server: asyncio.AbstractServer | None = None
        self.url = ""
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> CutProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self._writers):
            w.close()
        await self.server.wait_closed()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self._writers.update((cw, uw))
        state = {"get": False}

        async def up() -> None:
            while data := await cr.read(65536):
                # A pooled connection carries several requests: each starts a read here.
                for m in (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD "):
                    if data.startswith(m):
                        state["get"] = m == b"GET "
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down() -> None:
            sent = 0
            while data := await ur.read(65536):
                if state["get"] and self.delay:
                    await asyncio.sleep(self.delay)
                if state["get"] and self.cut_after is not None and self.cut_done < self.cuts:
                    if sent + len(data) > self.cut_after:
                        keep = max(0, self.cut_after - sent)
                        cw.write(data[:keep])
                        self.cut_done += 1
                        raise ConnectionResetError("cut by the test")
                sent += len(data)
                cw.write(data)
                await cw.drain()
            cw.close()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, uw):
                w.close()
                self._writers.discard(w)


@pytest.fixture
async def proxy(daemon: SandboxAgent) -> AsyncIterator[CutProxy]:
    p = await CutProxy(daemon.base_url).start()
    try:
        yield p
    finally:
        await p.close()
