"""The process terminal over its WebSocket."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_agent import ConflictError, HostApi, NotFoundError, SandboxAgent


async def read_until(term: object, needle: bytes, seen: bytearray) -> None:
    async def go() -> None:
        async for chunk in term:  # type: ignore[attr-defined]
            seen.extend(chunk)
            if needle in seen:
                return
        raise AssertionError(f"ended before {needle!r}: {bytes(seen)!r}")

    await asyncio.wait_for(go(), 20)


async def test_a_pty_shell_over_the_terminal_socket(daemon: SandboxAgent) -> None:
    async with HostApi(daemon.base_url) as host:
        p = await host.create_process("bash", ["--norc", "--noprofile", "-i"], tty=True, interactive=True,
                                      cols=100, rows=30)
        seen = bytearray()
        async with host.connect_process_terminal(p.id) as term:
            await term.send_input("stty size\n")
            await read_until(term, b"30 100", seen)
            await term.resize(120, 40)
            await term.send_input(b"stty size; tty; echo done-$((6*7))\n")
            await read_until(term, b"done-42", seen)
            assert b"40 120" in seen and b"/dev/pts/" in seen
            await term.send_input("exit 7\n")
            rest = [c async for c in term]
            assert term.exited and term.exit_code == 7, rest
        with pytest.raises(NotFoundError):
            async with host.connect_process_terminal("no-such-process"):
                pass
        plain = await host.create_process("sleep", ["5"])
        with pytest.raises(ConflictError):
            async with host.connect_process_terminal(plain.id):
                pass
        await host.kill_process(plain.id)
