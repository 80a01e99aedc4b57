"""start_local / SandboxAgent: spawn, token in the environment only, dispose leaves nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_agent import SandboxAgent, StartError, start_local


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


async def test_start_local_with_a_token_then_dispose_leaves_no_process(binary: str, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    sa = await start_local(
        binary_path=binary,
        token="tok-in-env-only",
        args=["--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work")],
    )
    async with sa:
        assert isinstance(sa, SandboxAgent) and sa.connected
        cmdline = Path(f"/proc/{sa.pid}/cmdline").read_bytes()
        assert b"tok-in-env-only" not in cmdline
        assert b"--ready-fd" in cmdline
        # Handed over in the environment, which the daemon then clears of it.
        assert b"tok-in-env-only" not in Path(f"/proc/{sa.pid}/environ").read_bytes()
        s = await sa.new_session()
        r = await sa.prompt(s.session_id, "hello")
        assert r.stop_reason == "end_turn"
        agents = [i.pid for i in await sa.list_instances() if i.pid]
        assert agents
        daemon_pid = sa.pid
    assert not alive(daemon_pid)
    for pid in agents:
        assert not alive(pid), f"agent {pid} left behind"
    with pytest.raises(ChildProcessError):
        os.waitpid(daemon_pid, os.WNOHANG)  # reaped: not our child any more


async def test_a_missing_binary_and_a_daemon_that_exits_fail_clearly(tmp_path: Path, binary: str) -> None:
    with pytest.raises(StartError, match="cannot start"):
        await start_local(binary_path=str(tmp_path / "nope"))
    with pytest.raises(StartError) as info:
        await start_local(binary_path=binary, args=["--no-such-flag"])
    assert "no-such-flag" in info.value.stderr_tail
