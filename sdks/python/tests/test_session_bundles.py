"""Session bundles through the SDK: ``export_session`` streamed from daemon A straight into
``import_session`` on daemon B (another state dir and work dir, a cwd mapping); the mock
session continues in B and remembers its codeword through the daemon's restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import start_daemon
from sandbox_agent import ConflictError, SandboxAgentClient


def _text(e: object) -> str:
    content = getattr(getattr(e, "update", None), "content", None)
    return getattr(content, "text", "") or ""


async def test_a_session_moves_between_daemons_as_a_stream(binary: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = await start_daemon(binary, tmp_path / "a", "--state-dir", str(tmp_path / "a" / "state"))
    b = await start_daemon(binary, tmp_path / "b", "--state-dir", str(tmp_path / "b" / "state"))
    work_a, work_b = str(tmp_path / "a" / "work"), str(tmp_path / "b" / "work")
    try:
        async with SandboxAgentClient(a.base_url, agent="mock", server_id="moving") as c:
            s = await c.new_session(cwd=work_a)
            await c.prompt(s.session_id, "codeword PEAR-9")
            async with c.export_session("moving") as stream:
                done = await b.import_session("moving", stream, cwd={work_a: work_b})
            assert done["sessions"] == [s.session_id]
            assert done["agent"] == "mock"
            with pytest.raises(ConflictError):
                async with c.export_session("moving") as again:
                    await b.import_session("moving", again)
        seen: list[str] = []
        async with SandboxAgentClient(
            b.base_url, agent="mock", server_id="moving", on_session_update=lambda e: seen.append(_text(e))
        ) as c2:
            await c2.prompt(s.session_id, "/history")
        assert "history: codeword PEAR-9" in seen
    finally:
        await a.dispose()
        await b.dispose()
