"""docs/sdk-python.md's quick start, run verbatim, and the examples in examples/python/."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from conftest import REPO, start_daemon

DOC = REPO / "docs" / "sdk-python.md"


def quickstart() -> tuple[str, str]:
    text = DOC.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"prints\n\n```\n(.*?)```", section, re.S)
    assert code and shown, "the quick start has a python block and what it prints"
    return code.group(1), shown.group(1)


async def run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    p = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(p.communicate(), 120)
    return p.returncode or 0, out.decode()


def env_with_binary(binary: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(binary).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("SANDBOX_AGENT_TOKEN", None)
    return env


async def test_the_quick_start_runs_verbatim(binary: str, tmp_path: Path) -> None:
    code, shown = quickstart()
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    # Run where a user would: its own directory (the daemon's work dir is the cwd).
    rc, out = await run([sys.executable, str(script)], tmp_path, env_with_binary(binary))
    assert rc == 0, out
    assert out == shown
    assert (tmp_path / "notes" / "hello.txt").read_bytes() == b"hi"


async def test_the_examples_run(binary: str, tmp_path: Path) -> None:
    env = env_with_binary(binary)
    rc, out = await run([sys.executable, str(REPO / "examples/python/agent_session.py")], tmp_path, env)
    assert rc == 0, out
    assert "[5] chunk 5 of 5" in out and "permission: allow-once" in out and "from the stream: hello" in out
    d = await start_daemon(binary, tmp_path)
    try:
        env["SANDBOX_AGENT_URL"] = d.base_url
        rc, out = await run([sys.executable, str(REPO / "examples/python/files_and_processes.py")], tmp_path, env)
        assert rc == 0, out
        assert "read back: hello from python" in out
        assert "stdout: tick 3" in out and "exit code: 0" in out and "gone: 404" in out
    finally:
        await d.dispose()


async def test_the_package_readme_example_runs(binary: str, tmp_path: Path) -> None:
    text = (REPO / "sdks/python/README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code
    script = tmp_path / "readme.py"
    script.write_text(code.group(1))
    rc, out = await run([sys.executable, str(script)], tmp_path, env_with_binary(binary))
    assert rc == 0, out
    assert out == "chunk 1 of 3\nchunk 2 of 3\nchunk 3 of 3\nend_turn\n"
