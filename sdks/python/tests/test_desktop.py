"""The desktop client (``host.desktop``) on a real Xvfb: start, a PNG of the right size, an xterm
launched through the API that receives typed text (observed in a file), problems as typed errors,
a recording downloaded as MP4 and deleted, the live view (frames, input read back), and stop."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
from pathlib import Path

import pytest

from sandbox_agent import BadRequestError, ConflictError, HostApi, NotFoundError, SandboxAgent

TOOLS = ["Xvfb", "openbox", "xdotool", "xclip", "ffmpeg", "xprop", "xterm"]


def need_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        reason = f"missing {missing}; run .ci/install-desktop.sh"
        if os.environ.get("SANDBOX_AGENT_TESTS_STRICT", "0") != "0":
            pytest.fail(f"SKIPPED under SANDBOX_AGENT_TESTS_STRICT: {reason}")
        pytest.skip(reason)


async def eventually(check, what: str, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_desktop_client_on_a_real_display(daemon: SandboxAgent, tmp_path: Path) -> None:
    need_tools()
    async with HostApi(daemon.base_url) as host:
        desk = host.desktop
        assert (await desk.status()).state in ("inactive", "install_required")
        with pytest.raises(ConflictError):
            await desk.mouse_move(1, 1)
        s = await desk.start(display_num=172, width=400, height=300)
        assert s.state == "active" and s.display == ":172"
        assert (await desk.display_info()).resolution.width == 400
        png = await desk.screenshot()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (400, 300)
        assert (await desk.screenshot_region(0, 0, 50, 40, format="jpeg"))[:2] == b"\xff\xd8"
        with pytest.raises(BadRequestError):
            await desk.screenshot_region(390, 0, 50, 40)

        out = tmp_path / "typed.txt"
        win = await desk.launch(
            "xterm",
            ["-geometry", "40x10+0+0", "-e", "sh", "-c", f'read line; printf %s "$line" > {out}'],
            wait=True,
        )
        assert win.window_id
        assert any(w.id == win.window_id for w in await desk.list_windows())
        await desk.focus_window(win.window_id)
        await desk.type_text("héllo python")
        await desk.press_key("Return")

        async def typed() -> str | None:
            return out.read_text() if out.exists() else None

        assert await eventually(typed, "the typed file") == "héllo python"
        with pytest.raises(BadRequestError):
            await desk.press_key("NoSuchKeyName")
        pos = await desk.mouse_move(25, 35)
        assert (pos.x, pos.y) == (25, 35)
        await desk.set_clipboard("clip ✓")
        assert (await desk.get_clipboard()).text == "clip ✓"

        rec = await desk.start_recording(fps=5)
        assert rec.status == "recording"
        await asyncio.sleep(1.2)
        done = await desk.stop_recording()
        assert done.status == "completed"
        assert (await desk.download_recording(done.id))[4:8] == b"ftyp"
        assert any(r.id == done.id for r in await desk.list_recordings())
        await desk.delete_recording(done.id)
        with pytest.raises(NotFoundError):
            await desk.get_recording(done.id)

        assert (await desk.stream_status())["active"] is False
        async with desk.connect_live_view(fps=5, quality=50) as view:
            assert (view.width, view.height) == (400, 300)
            frame = await asyncio.wait_for(view.__anext__(), 10)
            assert frame[:2] == b"\xff\xd8"
            await view.move(111, 22)

            async def moved() -> bool:
                p = await desk.mouse_position()
                return (p.x, p.y) == (111, 22)

            await eventually(moved, "the pointer moved by the live view")
            await view.move(99999, 1)

            async def drain() -> None:
                async for _ in view:
                    if view.errors:
                        return

            await asyncio.wait_for(drain(), 10)
            assert "x" in view.errors[0]
            stopped = await desk.stop()
            assert stopped.state == "inactive"
            rest = await asyncio.wait_for(_count(view), 10)
            assert view.end_message is not None, rest
        with pytest.raises(ConflictError):
            await desk.screenshot()


async def _count(view) -> int:  # type: ignore[no-untyped-def]
    n = 0
    async for _ in view:
        n += 1
    return n
