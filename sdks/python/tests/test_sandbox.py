"""SandboxAgent.start(sandbox=provider): providers written here as plain classes that run the
real binary as local processes (no container engine needed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent import SandboxAgent, SandboxDetachedError, SandboxStartError


class LocalProcesses:
    """A provider whose "sandboxes" are daemons on this machine, each with its own token."""

    name = "local"

    def __init__(self, binary: str, tmp: Path) -> None:
        self.binary, self.tmp = binary, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self.tokens: dict[str, str] = {}
        self.calls: list[str] = []

    async def create(self) -> str:
        self.calls.append("create")
        sid = uuid.uuid4().hex[:12]
        self.tokens[sid] = uuid.uuid4().hex
        self._spawn(sid)
        return sid

    def _spawn(self, sid: str) -> None:
        work = self.tmp / sid
        work.mkdir(exist_ok=True)
        r, w = os.pipe()
        env = {**os.environ, "SANDBOX_AGENT_TOKEN": self.tokens[sid]}
        self.procs[sid] = subprocess.Popen(
            [self.binary, "server", "--host", "127.0.0.1", "--port", "0", "--ready-fd", str(w),
             "--data-dir", str(work / "data"), "--work-dir", str(work)],
            pass_fds=(w,), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(w)
        with os.fdopen(r) as f:
            self.urls[sid] = json.loads(f.readline())["url"]

    def get_url(self, sid: str) -> str:
        self.calls.append("get_url")
        return self.urls[sid]

    async def get_token(self, sid: str) -> str:
        return self.tokens[sid]

    def reconnect(self, sid: str) -> None:
        self.calls.append("reconnect")

    def ensure_server(self, sid: str) -> None:
        self.calls.append("ensure_server")
        if self.procs[sid].poll() is not None:
            self._spawn(sid)

    def destroy(self, sid: str) -> None:
        self.calls.append("destroy")
        p = self.procs[sid]
        p.terminate()
        p.wait(15)

    def alive(self, sid: str) -> bool:
        return self.procs[sid].poll() is None

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def provider(binary: str, tmp_path: Path) -> Any:
    p = LocalProcesses(binary, tmp_path)
    yield p
    p.close()


async def test_start_dispose_reattach_and_destroy(provider: LocalProcesses) -> None:
    sa = await SandboxAgent.start(sandbox=provider)
    assert sa.connected and sa.sandbox_id is not None and sa.sandbox_id.startswith("local/")
    raw = sa.sandbox_id.split("/", 1)[1]
    s = await sa.new_session()
    assert (await sa.prompt(s.session_id, "hi")).stop_reason == "end_turn"
    await sa.write_file("kept.txt", "still here")
    await sa.dispose()
    assert provider.alive(raw)  # dispose leaves the sandbox running

    again = await SandboxAgent.start(sandbox=provider, sandbox_id=f"local/{raw}")
    assert provider.calls[-3:] == ["reconnect", "ensure_server", "get_url"]
    assert await again.read_file("kept.txt") == b"still here"
    # A provider without pause: pause_sandbox() falls back to destroy.
    await again.pause_sandbox()
    assert not provider.alive(raw) and provider.calls[-1] == "destroy"
    with pytest.raises(SandboxDetachedError):
        await again.destroy_sandbox()
    await again.aclose()


async def test_a_failing_create_is_a_create_step_error(provider: LocalProcesses) -> None:
    def boom() -> str:
        raise RuntimeError("quota exceeded")

    provider.create = boom  # type: ignore[method-assign,assignment]
    with pytest.raises(SandboxStartError) as info:
        await SandboxAgent.start(sandbox=provider)
    assert info.value.step == "create" and info.value.provider == "local" and info.value.sandbox_id is None
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_a_wrong_token_is_auth_and_the_new_sandbox_is_removed(provider: LocalProcesses) -> None:
    with pytest.raises(SandboxStartError) as info:
        await SandboxAgent.start(sandbox=provider, token="wrong")
    assert info.value.step == "auth" and info.value.sandbox_id is not None
    raw = info.value.sandbox_id.split("/", 1)[1]
    assert not provider.alive(raw) and provider.calls[-1] == "destroy"


async def test_a_daemon_that_never_answers_is_health_within_the_timeout(provider: LocalProcesses) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again below: nothing listens
    real_create = provider.create

    async def create() -> str:
        sid = await real_create()
        provider.urls[sid] = dead
        return sid

    provider.create = create  # type: ignore[method-assign]
    with pytest.raises(SandboxStartError) as info:
        await SandboxAgent.start(sandbox=provider, health_timeout=2.0, ensure_server_after=3)
    assert info.value.step == "health"
    assert "ensure_server" in provider.calls  # called after repeated failed probes
    raw = (info.value.sandbox_id or "").split("/", 1)[1]
    assert not provider.alive(raw)


async def test_a_failing_connect_is_a_connect_step_error(provider: LocalProcesses) -> None:
    with pytest.raises(SandboxStartError) as info:
        await SandboxAgent.start(sandbox=provider, agent="no-such-agent")
    assert info.value.step == "connect"
    raw = (info.value.sandbox_id or "").split("/", 1)[1]
    assert not provider.alive(raw)
