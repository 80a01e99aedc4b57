"""The blocking wrapper (sandbox_agent.sync), used from plain (non-async) test functions."""

from __future__ import annotations

import threading
from pathlib import Path

from sandbox_agent import NotFoundError, SessionUpdateEvent, WatchRescan
from sandbox_agent.sync import HostApi, SandboxAgentClient, start_local


def test_sync_start_prompt_files_and_watch(binary: str, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    seen: list[str] = []
    with start_local(
        binary_path=binary,
        args=["--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work")],
        on_session_update=lambda e: seen.append(e.update.content.text),
    ) as sa:
        s = sa.new_session()
        assert sa.prompt(s.session_id, "/stream 4").stop_reason == "end_turn"
        assert seen == [f"chunk {i} of 4" for i in range(1, 5)]
        assert sa.connected and sa.server_id.startswith("sdk-mock-")
        with sa.watch(".") as w:
            assert isinstance(next(w), WatchRescan)
            sa.write_file("a.txt", b"abc")
            kinds = {next(w).kind for _ in range(2)}
            assert "create" in kinds
        with sa.read_file_stream("a.txt") as chunks:
            assert b"".join(chunks) == b"abc"
        try:
            sa.read_file("missing")
            raise AssertionError("no 404")
        except NotFoundError as e:
            assert e.status == 404
        url = sa.base_url

        # A second client of the same daemon, by itself; its updates as an iterator.
        with SandboxAgentClient(url, agent="mock") as c:
            s2 = c.new_session()
            with c.updates(s2.session_id) as updates:
                c.prompt(s2.session_id, "hi")
                ev = next(updates)
                assert isinstance(ev, SessionUpdateEvent) and ev.update.content.text == "hi"
        with HostApi(url) as host:
            assert host.get_health().status == "ok"
        pid = sa.pid
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert not any(t.name == "sandbox-agent-sync" for t in threading.enumerate())
