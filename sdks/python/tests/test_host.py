"""HostApi against the real daemon: files, watch, processes, config."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conftest import CutProxy, start_daemon
from sandbox_agent import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    HostApi,
    NotFoundError,
    ProcessLogEntry,
    SandboxAgent,
    UnauthorizedError,
    WatchChange,
    WatchRescan,
)


async def test_five_mib_round_trip_streamed_both_ways(daemon: SandboxAgent) -> None:
    block = os.urandom(1 << 16)
    want = hashlib.sha256()

    async def source() -> AsyncIterator[bytes]:
        for i in range(80):  # 80 x 64 KiB = 5 MiB
            chunk = bytes([i]) + block[1:]
            want.update(chunk)
            yield chunk

    async with HostApi(daemon.base_url) as host:
        res = await host.write_file("big/file.bin", source())
        assert res.bytes_written == 5 << 20
        assert res.path.endswith("/big/file.bin")
        got = hashlib.sha256()
        n = 0
        async with host.read_file_stream("big/file.bin") as stream:
            async for chunk in stream:
                got.update(chunk)
                n += len(chunk)
        assert n == 5 << 20 and got.hexdigest() == want.hexdigest()
        assert (await host.stat("big/file.bin")).size == 5 << 20
        # A file object and text work too; a range reads a slice.
        await host.write_file("small.txt", io.BytesIO(b"0123456789"))
        assert await host.read_file("small.txt", range="bytes=2-4") == b"234"
        await host.write_file("small.txt", "héllo")
        assert (await host.read_file("small.txt")).decode() == "héllo"
        names = [e.name for e in await host.list_entries(".")]
        assert names == ["big", "small.txt"]
        await host.mkdir("d/e")
        moved = await host.move("small.txt", "d/e/moved.txt")
        assert moved.to.endswith("d/e/moved.txt")
        with pytest.raises(ConflictError):
            await host.delete_entry("d")
        await host.delete_entry("d", recursive=True)


async def test_typed_404_and_403(binary: str, tmp_path: Path) -> None:
    d = await start_daemon(binary, tmp_path, "--fs-root", str(tmp_path / "work"))
    try:
        async with HostApi(d.base_url) as host:
            with pytest.raises(NotFoundError) as nf:
                await host.read_file("missing.txt")
            assert nf.value.status == 404 and nf.value.title
            with pytest.raises(NotFoundError):
                async with host.read_file_stream("missing.txt"):
                    pass
            with pytest.raises(ForbiddenError) as fb:
                await host.read_file("/etc/hostname")
            assert fb.value.status == 403
            assert fb.value.problem["status"] == 403
    finally:
        await d.dispose()


async def test_upload_batch_extracts_a_tar(daemon: SandboxAgent) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("a/one.txt", b"1"), ("a/two.txt", b"22")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    async with HostApi(daemon.base_url) as host:
        res = await host.upload_batch(buf.getvalue(), path="up")
        assert sorted(Path(p).name for p in res.paths) == ["one.txt", "two.txt"]
        assert await host.read_file("up/a/two.txt") == b"22"


async def test_token_and_401(binary: str, tmp_path: Path) -> None:
    d = await start_daemon(binary, tmp_path, token="s3cret")
    try:
        async with HostApi(d.base_url) as bad:
            with pytest.raises(UnauthorizedError):
                await bad.list_agents()
        async with HostApi(d.base_url, token="s3cret") as good:
            agents = await good.list_agents()
            assert any(a.id == "mock" for a in agents)
    finally:
        await d.dispose()


async def test_run_process_and_follow_its_log_across_cuts(daemon: SandboxAgent, proxy: CutProxy) -> None:
    async with HostApi(daemon.base_url) as host:
        r = await host.run_process("sh", ["-c", "echo out; echo err >&2; exit 3"])
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)

    proxy.cut_after = 3000
    proxy.cuts = 3
    script = "for i in $(seq 1 400); do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxx; sleep 0.002; done"
    async with HostApi(proxy.url) as host:
        p = await host.create_process(sys.executable if False else "sh", ["-c", script])
        entries: list[ProcessLogEntry] = []
        async with host.follow_process_logs(p.id) as logs:
            async for entry in logs:
                entries.append(entry)
        assert proxy.cut_done == 3
        # Every byte once, in order: the entries tile the byte offsets exactly.
        offset = 0
        for e in entries:
            assert e.sequence == offset + len(e.data)
            offset = e.sequence
        text = b"".join(e.data for e in entries).decode()
        assert text == "".join(f"line-{i}-xxxxxxxxxxxxxxxxxxxxxxxx\n" for i in range(1, 401))
        info = await host.get_process(p.id)
        assert info.status == "exited" and info.exit_code == 0
        page = await host.get_process_logs(p.id, tail=1)
        assert page.entries[-1].text.endswith("line-400-xxxxxxxxxxxxxxxxxxxxxxxx\n")
        await host.delete_process(p.id)
        with pytest.raises(NotFoundError):
            await host.get_process(p.id)


async def test_process_input_and_stop(daemon: SandboxAgent) -> None:
    async with HostApi(daemon.base_url) as host:
        p = await host.create_process("cat", interactive=True)
        await host.send_process_input(p.id, "hi ")
        await host.send_process_input(p.id, b"\x00there\n")
        with pytest.raises(ConflictError):
            await host.delete_process(p.id)
        for _ in range(100):
            logs = await host.get_process_logs(p.id)
            if b"".join(e.data for e in logs.entries) == b"hi \x00there\n":
                break
            await asyncio.sleep(0.05)
        assert b"".join(e.data for e in logs.entries) == b"hi \x00there\n"
        stopped = await host.stop_process(p.id, wait_ms=5000)
        assert stopped.status == "exited"
        assert any(q.id == p.id for q in await host.list_processes())


async def test_watch_reports_changes_and_a_write_as_a_rename_into_place(daemon: SandboxAgent) -> None:
    async with HostApi(daemon.base_url) as host:
        await host.mkdir("w")
        items: list[WatchChange | WatchRescan] = []
        async with host.watch("w", recursive=True, ignore=["node_modules"]) as w:
            first = await w.__anext__()
            assert isinstance(first, WatchRescan) and first.reason == "start"
            await host.mkdir("w/node_modules")
            await host.write_file("w/a.txt", b"x")
            await host.move("w/a.txt", "w/b.txt")
            await host.delete_entry("w/b.txt")
            async for item in w:
                items.append(item)
                if isinstance(item, WatchChange) and item.kind == "remove" and item.path.endswith("/w/b.txt"):
                    break
        changes = [i for i in items if isinstance(i, WatchChange)]
        assert not any("node_modules" in c.path for c in changes)
        # The write: a temporary created beside it, then renamed onto a.txt.
        into_place = [c for c in changes if c.kind == "rename" and c.path.endswith("/w/a.txt")]
        assert into_place and into_place[0].old_path is not None
        assert Path(into_place[0].old_path).parent == Path(into_place[0].path).parent
        assert any(c.kind == "rename" and c.path.endswith("/w/b.txt") and (c.old_path or "").endswith("/w/a.txt")
                   for c in changes)
        # The watched directory's own removal ends the stream.
        async with host.watch("w") as w2:
            assert isinstance(await w2.__anext__(), WatchRescan)
            await host.delete_entry("w", recursive=True)
            rest = [i async for i in w2]
        assert isinstance(rest[-1], WatchChange) and rest[-1].kind == "remove"
        with pytest.raises(NotFoundError):
            async with host.watch("nope"):
                pass


async def test_watch_reconnects_after_a_cut(daemon: SandboxAgent, proxy: CutProxy) -> None:
    async with HostApi(proxy.url) as host:
        await host.mkdir("w")
        async with host.watch("w") as w:
            assert (await w.__anext__()) == WatchRescan(reason="start")
            proxy.cut_after = 0
            proxy.cuts = 1
            await host.write_file("w/x.txt", b"1")
            nxt = await asyncio.wait_for(w.__anext__(), 20)
            assert nxt == WatchRescan(reason="reconnect")
            await host.delete_entry("w/x.txt")
            after = await asyncio.wait_for(w.__anext__(), 20)
            assert isinstance(after, WatchChange) and after.kind == "remove"


async def test_mcp_config_round_trip(daemon: SandboxAgent) -> None:
    async with HostApi(daemon.base_url) as host:
        work = (await host.stat(".")).path
        entry = {"type": "local", "command": "echo", "args": ["hi"]}
        await host.set_mcp_config(work, "one", entry)
        got = await host.get_mcp_config(work, "one")
        assert got["command"] == "echo"
        await host.delete_mcp_config(work, "one")
        with pytest.raises(NotFoundError):
            await host.get_mcp_config(work, "one")


async def test_agents_instances_and_process_config(daemon: SandboxAgent) -> None:
    from sandbox_agent import ProcessConfig

    async with HostApi(daemon.base_url) as host:
        mock = await host.get_agent("mock")
        assert mock.id == "mock" and mock.installed
        outcome = await host.install_agent("mock")
        assert "alreadyInstalled" in outcome
        assert await host.list_instances() == []
        empty = await host.list_all_sessions()
        assert empty.sessions == [] and empty.next_cursor is None
        with pytest.raises(BadRequestError):
            await host.list_all_sessions(limit=0)
        cfg = await host.get_process_config()
        changed = await host.set_process_config(cfg.model_copy(update={"max_output_bytes": 12345}))
        assert isinstance(changed, ProcessConfig) and changed.max_output_bytes == 12345
        assert (await host.get_process_config()).max_output_bytes == 12345
        await host.set_process_config(cfg)
        p = await host.create_process("sleep", ["30"], tty=True, cols=80, rows=24)
        await host.resize_process_terminal(p.id, 100, 50)
        killed = await host.kill_process(p.id, wait_ms=5000)
        assert killed.status == "exited" and killed.exit_signal == 9


async def test_log_follow_reports_the_output_the_daemon_dropped_as_a_gap(binary: str, tmp_path: Path) -> None:
    from sandbox_agent import Gap

    d = await start_daemon(binary, tmp_path, "--process-max-log-bytes", "16K")
    try:
        async with HostApi(d.base_url) as host:
            p = await host.create_process("sh", ["-c", "yes xxxxxxx | head -c 65536"])
            for _ in range(200):
                if (await host.get_process(p.id)).status == "exited":
                    break
                await asyncio.sleep(0.05)
            gaps: list[Gap] = []
            got = bytearray()
            async with host.follow_process_logs(p.id, since=0, on_gap=gaps.append) as logs:
                async for entry in logs:
                    got += entry.data
            assert len(gaps) == 1 and gaps[0].from_ == 0
            # What was lost plus what came is the whole output, each byte once.
            assert gaps[0].to + len(got) == 65536 and set(got) <= set(b"x\n")
            # Without on_gap the loss is a warning, never silent.
            with pytest.warns(RuntimeWarning, match="lost"):
                async with host.follow_process_logs(p.id, since=0) as logs:
                    async for _ in logs:
                        pass
    finally:
        await d.dispose()


async def test_list_pages_walk_with_limit_and_cursor(daemon: SandboxAgent) -> None:
    async with HostApi(daemon.base_url) as host:
        await host.mkdir("pg")
        for name in ["c", "a", "b"]:
            await host.write_file(f"pg/{name}", name)
        first = await host.list_entries_page("pg", limit=2)
        assert [e.name for e in first.items] == ["a", "b"] and first.next_cursor
        rest = await host.list_entries_page("pg", limit=2, cursor=first.next_cursor)
        assert [e.name for e in rest.items] == ["c"] and rest.next_cursor is None

        agents: list[str] = []
        cursor = None
        while True:
            page = await host.list_agents_page(limit=1, cursor=cursor)
            agents += [a.id for a in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert agents == sorted(a.id for a in await host.list_agents())

        assert (await host.list_instances_page(limit=5)).items == []
        assert (await host.list_processes_page(limit=5)).next_cursor is None
        with pytest.raises(BadRequestError):
            await host.list_instances_page(limit=0)
