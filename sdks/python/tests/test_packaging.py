"""The package as users get it: typed (mypy --strict), built (wheel + sdist), installed by pip
and by uv into fresh environments."""

from __future__ import annotations

import asyncio
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

PKG = REPO / "sdks" / "python"
BIN_DIR = Path(sys.executable).parent


async def run(*argv: str | Path, cwd: Path = PKG, timeout: float = 600) -> str:
    p = await asyncio.create_subprocess_exec(
        *map(str, argv), cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(p.communicate(), timeout)
    text = out.decode(errors="replace")
    assert p.returncode == 0, f"{argv}: exit {p.returncode}\n{text}"
    return text


def tool(name: str) -> Path:
    path = BIN_DIR / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"{name} is not installed (.ci/install-python-sdk.sh)")
        return Path(found)
    return path


async def test_mypy_strict_on_the_package_and_the_examples() -> None:
    await run(sys.executable, "-m", "mypy", "--strict", "src/sandbox_agent")
    await run(sys.executable, "-m", "mypy", "--strict", *sorted((REPO / "examples/python").glob("*.py")))


async def test_build_makes_a_wheel_with_py_typed_and_an_sdist(tmp_path: Path) -> None:
    # --no-isolation: the build backend (setuptools) comes from this venv, not a download.
    await run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp_path, ".")
    wheels = list(tmp_path.glob("sandbox_agent-*.whl"))
    sdists = list(tmp_path.glob("sandbox_agent-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(tmp_path.iterdir())
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "sandbox_agent/py.typed" in names and "sandbox_agent/client.py" in names
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheels[0]).read(meta).decode()
    assert "Name: sandbox-agent" in text and "Requires-Python: >=3.10" in text
    assert "Requires-Dist: agent-client-protocol==0.12.1" in text


async def test_pip_and_uv_install_into_fresh_venvs(tmp_path: Path) -> None:
    probe = "import sandbox_agent, acp; print(sandbox_agent.__version__, sandbox_agent.SandboxAgentClient.__name__)"
    pip_venv = tmp_path / "pip-venv"
    await run(sys.executable, "-m", "venv", pip_venv)
    # A copy, so that the build leaves nothing in the source tree.
    src = tmp_path / "src-copy"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns(".venv", "build", "dist", "*.egg-info", "__pycache__"))
    await run(pip_venv / "bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", src)
    assert "SandboxAgentClient" in await run(pip_venv / "bin/python", "-c", probe)

    uv = tool("uv")
    uv_venv = tmp_path / "uv-venv"
    await run(uv, "venv", "--quiet", "--python", sys.executable, uv_venv)
    await run(uv, "pip", "install", "--quiet", "--python", uv_venv / "bin/python", src)
    assert "SandboxAgentClient" in await run(uv_venv / "bin/python", "-c", probe)
