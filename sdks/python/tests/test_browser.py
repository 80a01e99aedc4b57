"""The browser client (``host.browser``) on a real Chromium: problems before ``start`` as typed
errors, a page served on loopback navigated to, viewport and full-page screenshots (PNG sizes read
back), text and markdown, the accessibility snapshot, tabs, a DevTools command through the proxy
URL ``cdp_url`` gives (with the token in the query), and stop."""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import AsyncIterator

import pytest

from sandbox_agent import BadRequestError, ConflictError, HostApi, NotFoundError, SandboxAgent

from conftest import start_daemon

CHROMIUM = "/usr/bin/chromium"
TOKEN = "py-browser-token"
PAGE = (
    b"<!doctype html><html><head><title>Py page</title></head><body style='margin:0'>"
    b"<h1>Py heading</h1><p>Some <b>bold</b> words.</p><button>Push</button>"
    b"<div style='height:2500px'>tall</div></body></html>"
)


def need_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} is missing; run .ci/install-inspector.sh"
        if os.environ.get("SANDBOX_AGENT_TESTS_STRICT", "0") != "0":
            pytest.fail(f"SKIPPED under SANDBOX_AGENT_TESTS_STRICT: {reason}")
        pytest.skip(reason)


@pytest.fixture
async def page_url() -> AsyncIterator[str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {len(PAGE)}\r\nconnection: close\r\n\r\n"
        writer.write(head.encode() + PAGE)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/page"
    finally:
        server.close()


def png_size(b: bytes) -> tuple[int, int]:
    assert b[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", b[16:24])


async def test_browser_client_on_a_real_chromium(binary: str, tmp_path, page_url: str) -> None:  # type: ignore[no-untyped-def]
    sa: SandboxAgent = await start_daemon(binary, tmp_path, token=TOKEN)
    try:
        async with HostApi(sa.base_url, token=TOKEN) as host:
            br = host.browser
            assert (await br.status()).state == "inactive"
            with pytest.raises(ConflictError):
                await br.list_tabs()
            with pytest.raises(BadRequestError) as bad:
                await br.navigate("file:///etc/passwd")
            assert bad.value.problem.get("field") == "url"
            with pytest.raises(BadRequestError):
                await br.start(width=5)
            need_chromium()

            s = await br.start(width=800, height=600)
            assert s.state == "active" and s.headless is True and s.pid and s.restarts == 0
            tab = await br.navigate(page_url, wait_until="load")
            assert tab.title == "Py page"
            vw, vh = png_size(await br.screenshot())
            assert vw <= 800 and vh <= 600
            _, fh = png_size(await br.screenshot(full_page=True))
            assert fh > 2500 > vh
            assert (await br.screenshot(format="jpeg", quality=40))[:2] == b"\xff\xd8"

            text = await br.content()
            assert text.format == "text" and "Py heading" in text.content
            md = await br.content(format="markdown")
            assert "# Py heading" in md.content and "**bold**" in md.content
            ax = await br.accessibility()
            assert any(n.role == "heading" and n.name == "Py heading" for n in ax.nodes)
            assert any(n.role == "button" and n.name == "Push" for n in ax.nodes)
            small = await br.accessibility(max_nodes=2)
            assert len(small.nodes) == 2 and small.truncated

            second = await br.open_tab("about:blank")
            assert len(await br.list_tabs()) == 2
            await br.activate_tab(tab.id)
            await br.close_tab(second.id)
            for _ in range(200):
                if len(await br.list_tabs()) == 1:
                    break
                await asyncio.sleep(0.05)
            assert [t.id for t in await br.list_tabs()] == [tab.id]
            with pytest.raises(NotFoundError):
                await br.close_tab("ABCDEF0123")

            version = await br.cdp_version()
            assert version["webSocketDebuggerUrl"].endswith("/v1/browser/cdp")
            assert br.cdp_endpoint() == f"{sa.base_url}/v1/browser/cdp"
            from websockets.asyncio.client import connect

            url = br.cdp_url(TOKEN)
            assert url.startswith("ws://") and url.endswith(f"/v1/browser/cdp?access_token={TOKEN}")
            async with connect(url, max_size=None) as ws:
                await ws.send(json.dumps({"id": 1, "method": "Target.getTargets"}))
                while True:
                    msg = json.loads(await ws.recv())
                    if msg.get("id") == 1:
                        break
            urls = [t["url"] for t in msg["result"]["targetInfos"] if t["type"] == "page"]
            assert page_url in urls, urls

            assert (await br.stop()).state == "inactive"
            with pytest.raises(ConflictError):
                await br.accessibility()
    finally:
        await sa.dispose()
