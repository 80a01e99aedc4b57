"""The workspace methods (git, search, ports, preview links) against the real daemon, with a real
repository built here and a real ``python3 -m http.server`` as the port."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from sandbox_agent import (
    GitAuthor,
    GitBranches,
    GitCommit,
    GitDiff,
    GitFileStatus,
    GitLog,
    GitStatus,
    GitWorktree,
    GlobResult,
    GrepMatch,
    GrepResult,
    HostApi,
    HttpError,
    PortInfo,
    Preview,
    SandboxAgent,
    SessionGitBase,
)

if shutil.which("git") is None:  # pragma: no cover - CI installs git
    pytest.fail("git is not installed")


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e",
           "HOME": str(cwd), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _repo(d: Path) -> Path:
    d.mkdir(parents=True)
    _git(d, "init", "-q", "-b", "main")
    (d / "a.txt").write_text("one\ntwo\n")
    _git(d, "add", "-A")
    _git(d, "commit", "-qm", "first")
    return d


async def test_git_status_diff_commit_log_branches_worktrees_and_clone(daemon: SandboxAgent, tmp_path: Path) -> None:
    r = _repo(tmp_path / "work" / "repo")
    base = _git(r, "rev-parse", "HEAD")
    (r / "a.txt").write_text("one\nTWO\n")
    (r / "new.txt").write_text("fresh\n")
    async with HostApi(daemon.base_url) as host:
        st = await host.git_status(str(r))
        assert isinstance(st, GitStatus)
        assert st.branch == "main" and st.head == base and st.ahead is None
        assert all(isinstance(f, GitFileStatus) for f in st.files)
        assert {(f.path, f.status, f.staged) for f in st.files} == {("a.txt", "modified", False), ("new.txt", "untracked", False)}
        diff = await host.git_diff(str(r))
        assert isinstance(diff, GitDiff) and diff.base == base
        by = {f.path: f for f in diff.files}
        assert by["a.txt"].additions == 1 and by["a.txt"].deletions == 1 and "+TWO" in by["a.txt"].patch
        assert by["a.txt"].binary is False and by["a.txt"].old_path is None
        assert by["new.txt"].status == "added"
        sha = (await host.git_commit(str(r), "second", all=True, author=GitAuthor(name="Agent", email="a@e"))).sha
        with pytest.raises(HttpError) as e:
            await host.git_commit(str(r), "nothing", all=True)
        assert e.value.status == 409
        log = await host.git_log(str(r), 5)
        assert isinstance(log, GitLog) and all(isinstance(c, GitCommit) for c in log.commits)
        assert [c.sha for c in log.commits] == [sha, base]
        assert log.commits[0].author == GitAuthor(name="Agent", email="a@e")
        assert log.commits[0].parents == [base] and log.commits[0].subject == "second" and log.commits[0].time > 0
        # What changed since the first commit, after the commit.
        assert {f.path for f in (await host.git_diff(str(r), base)).files} == {"a.txt", "new.txt"}
        with pytest.raises(HttpError) as e:
            await host.git_diff(str(r), "no-such-rev")
        assert e.value.status == 400
        assert (await host.git_checkout(str(r), "feature", create=True)).branch == "feature"
        br = await host.git_branches(str(r))
        assert isinstance(br, GitBranches) and br.current == "feature"
        assert {(b.name, b.head) for b in br.branches} == {("main", sha), ("feature", sha)}
        dest = tmp_path / "work" / "wt1"
        wt = await host.add_worktree(str(r), str(dest), "agent-1")
        assert isinstance(wt, GitWorktree) and wt.branch == "agent-1" and wt.head == sha and (dest / "a.txt").exists()
        wts = await host.list_worktrees(str(r))
        assert [w.path for w in wts] == [str(r), str(dest)] and all(isinstance(w, GitWorktree) for w in wts)
        (dest / "dirty.txt").write_text("x")
        with pytest.raises(HttpError) as e:
            await host.remove_worktree(str(dest))
        assert e.value.status == 409
        await host.remove_worktree(str(dest), force=True)
        assert not dest.exists()
        clone = tmp_path / "work" / "clone"
        c = await host.git_clone(str(r), str(clone), branch="main", depth=1)
        assert isinstance(c, GitWorktree) and c.path == str(clone) and c.branch == "main" and c.head == sha
        assert _git(clone, "rev-parse", "HEAD") == sha
        with pytest.raises(HttpError) as e:
            await host.git_status(str(tmp_path / "work"))
        assert e.value.status == 404


async def test_a_sessions_git_base_is_typed_on_its_instance(daemon: SandboxAgent, tmp_path: Path) -> None:
    r = _repo(tmp_path / "work" / "repo")
    base = _git(r, "rev-parse", "HEAD")
    async with HostApi(daemon.base_url) as host, httpx.AsyncClient() as plain:
        new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(r), "mcpServers": []}}
        a = (await plain.post(f"{daemon.base_url}/v1/acp/py-gb?agent=mock", json=new)).json()
        sid = a["result"]["sessionId"]
        (inst,) = [i for i in await host.list_instances() if i.server_id == "py-gb"]
        assert inst.sessions == [SessionGitBase(session_id=sid, cwd=str(r), git_base=base)]


async def test_glob_and_grep(daemon: SandboxAgent, tmp_path: Path) -> None:
    r = _repo(tmp_path / "work" / "src")
    (r / ".gitignore").write_text("ignored/\n")
    (r / "ignored").mkdir()
    (r / "ignored" / "x.txt").write_text("needle\n")
    (r / "b.txt").write_text("hay\nNeedle here\n")
    async with HostApi(daemon.base_url) as host:
        g = await host.glob(str(r), "*.txt")
        assert isinstance(g, GlobResult)
        assert sorted(Path(p).name for p in g.paths) == ["a.txt", "b.txt"] and g.truncated is False
        assert (await host.glob(str(r), "*.txt", limit=1)).truncated is True
        m = await host.grep(str(r), "needle", ignore_case=True)
        assert isinstance(m, GrepResult) and m.truncated is False
        assert m.matches == [GrepMatch(path=str(r / "b.txt"), line=2, column=1, text="Needle here")]
        assert (await host.grep(str(r), "needle")).matches == []
        with pytest.raises(HttpError) as e:
            await host.grep(str(r), "(")
        assert e.value.status == 400


async def test_ports_list_and_a_preview_link_without_the_token(binary: str, tmp_path: Path) -> None:
    from conftest import start_daemon

    sa = await start_daemon(binary, tmp_path, token="py-ws-token")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "hello.txt").write_text("hello from the app\n")
    app = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path / "site", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        async with HostApi(sa.base_url, token="py-ws-token") as host:
            for _ in range(200):
                if any(p.port == port for p in await host.list_ports()):
                    break
                await asyncio.sleep(0.05)
            row = next(p for p in await host.list_ports() if p.port == port)
            assert isinstance(row, PortInfo)
            assert row.pid == app.pid and row.address == "127.0.0.1" and row.command and "http.server" in row.command
            async with httpx.AsyncClient() as plain:
                # The proxy needs the token; the preview link does not.
                r = await plain.get(host.port_proxy_url(port, "/hello.txt"))
                assert r.status_code == 401
                r = await plain.get(host.port_proxy_url(port, "/hello.txt"), headers={"authorization": "Bearer py-ws-token"})
                assert r.text == "hello from the app\n"
                pv = await host.create_preview(port, ttl="10m")
                assert isinstance(pv, Preview) and pv.url.startswith(sa.base_url + "/preview/")
                left = datetime.fromisoformat(pv.expires_at.replace("Z", "+00:00")) - datetime.now(timezone.utc)
                assert timedelta(minutes=8) < left <= timedelta(minutes=10, seconds=5)
                r = await plain.get(pv.url + "hello.txt")
                assert r.status_code == 200 and r.text == "hello from the app\n"
    finally:
        app.terminate()
        app.wait()
        await sa.dispose()
