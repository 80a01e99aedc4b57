"""The browser (``/v1/browser/*``): ``host.browser`` has one method per route of the daemon's one
supervised Chromium (start, stop, status, tabs, navigation, screenshots, the page as text or
markdown, the accessibility snapshot) and gives the URLs of its token-checked DevTools proxy
(for Playwright's ``connect_over_cdp``). Every non-2xx answer raises the matching
:class:`HttpError` (409 before ``start``, 400 naming the ``field``, 404 for an unknown tab, 503
naming a missing Debian ``package``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlencode

from pydantic import Field

from .models import Model

if TYPE_CHECKING:
    from .host import HostApi

__all__ = [
    "BrowserApi",
    "BrowserStatus",
    "BrowserLastError",
    "BrowserTab",
    "BrowserContent",
    "BrowserAxNode",
    "BrowserAccessibility",
]

_P = "/v1/browser"
WaitUntil = Literal["commit", "domcontentloaded", "load"]


class BrowserLastError(Model):
    """``code``: ``start_failed``, ``browser_exited`` (died, restarted), ``restart_exhausted``
    (too many quick crashes in a row: it stays down) or ``restart_failed``."""

    code: str
    message: str


class BrowserStatus(Model):
    """``state``: ``inactive``, ``starting``, ``active``, ``restarting``, ``stopping`` or ``failed``."""

    state: str
    headless: bool | None = None
    display: str | None = None
    pid: int | None = None
    version: str | None = None
    #: Unix milliseconds.
    started_at: int | None = None
    last_error: BrowserLastError | None = None
    missing_package: str | None = None
    #: Times the daemon restarted Chromium after it died, since the last ``start``.
    restarts: int = 0
    #: Unix milliseconds of the pending restart, while ``restarting``.
    next_restart_at: int | None = None


class BrowserTab(Model):
    id: str
    url: str = ""
    title: str = ""


class BrowserContent(Model):
    url: str
    title: str
    format: str
    content: str
    truncated: bool = False


class BrowserAxNode(Model):
    """One node of the accessibility snapshot; ``depth`` places it under the nearest earlier node
    one level up."""

    id: str
    depth: int
    role: str
    name: str = ""
    value: str | None = None
    backend_node_id: int | None = Field(default=None, alias="backendNodeId")


class BrowserAccessibility(Model):
    url: str
    nodes: list[BrowserAxNode]
    truncated: bool = False


def _body(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _tab(id: str) -> str:
    return f"{_P}/tabs/{quote(id, safe='')}"


class BrowserApi:
    """``host.browser``: the browser routes (docs/browser.md of the daemon)."""

    def __init__(self, host: HostApi) -> None:
        self._host = host

    async def _j(self, method: str, path: str, **kw: Any) -> Any:
        return await self._host._json(method, path, **kw)

    async def status(self) -> BrowserStatus:
        return BrowserStatus.model_validate(await self._j("GET", f"{_P}/status"))

    async def start(
        self, *, headless: bool | None = None, width: int | None = None, height: int | None = None
    ) -> BrowserStatus:
        """Starts Chromium (headless unless ``headless=False``, which needs a running desktop);
        ``width``/``height`` 64..=4096 (default 1280×720)."""
        body = _body(headless=headless, width=width, height=height)
        return BrowserStatus.model_validate(await self._j("POST", f"{_P}/start", json_body=body))

    async def stop(self) -> BrowserStatus:
        """Ends Chromium and everything it started; removes its profile."""
        return BrowserStatus.model_validate(await self._j("POST", f"{_P}/stop"))

    async def list_tabs(self) -> list[BrowserTab]:
        """The open tabs, most recently active first."""
        return [BrowserTab.model_validate(t) for t in (await self._j("GET", f"{_P}/tabs"))["tabs"]]

    async def open_tab(self, url: str | None = None) -> BrowserTab:
        """Opens a tab (http, https, about or data; default ``about:blank``); at most 32."""
        return BrowserTab.model_validate(await self._j("POST", f"{_P}/tabs", json_body=_body(url=url)))

    async def close_tab(self, id: str) -> None:
        await self._host._send("DELETE", _tab(id))

    async def activate_tab(self, id: str) -> None:
        await self._host._send("POST", f"{_tab(id)}/activate")

    async def navigate(
        self,
        url: str,
        *,
        tab_id: str | None = None,
        wait_until: WaitUntil | None = None,
        timeout_ms: int | None = None,
    ) -> BrowserTab:
        """Navigates (the active tab unless ``tab_id``) and waits for ``wait_until`` (default ``load``)."""
        body = _body(url=url, tabId=tab_id, waitUntil=wait_until, timeoutMs=timeout_ms)
        return BrowserTab.model_validate(await self._j("POST", f"{_P}/navigate", json_body=body))

    async def screenshot(
        self,
        *,
        tab_id: str | None = None,
        format: Literal["png", "jpeg"] | None = None,
        quality: int | None = None,
        full_page: bool | None = None,
    ) -> bytes:
        """The viewport (or the whole page with ``full_page=True``) as PNG or JPEG bytes."""
        q = _body(tabId=tab_id, format=format, quality=quality,
                  fullPage=None if full_page is None else str(full_page).lower())
        return (await self._host._send("GET", f"{_P}/screenshot", params=q)).content

    async def content(
        self, *, tab_id: str | None = None, format: Literal["text", "markdown"] | None = None
    ) -> BrowserContent:
        """The page's text (``innerText``) or markdown, at most 2,000,000 characters."""
        raw = await self._j("GET", f"{_P}/content", params=_body(tabId=tab_id, format=format))
        return BrowserContent.model_validate(raw)

    async def accessibility(
        self, *, tab_id: str | None = None, max_nodes: int | None = None, max_depth: int | None = None
    ) -> BrowserAccessibility:
        """The accessibility tree in preorder (ignored and unnamed generic nodes left out)."""
        q = _body(tabId=tab_id, maxNodes=max_nodes, maxDepth=max_depth)
        return BrowserAccessibility.model_validate(await self._j("GET", f"{_P}/accessibility", params=q))

    async def cdp_version(self) -> dict[str, Any]:
        """Chromium's discovery document, its ``webSocketDebuggerUrl`` pointing back at the proxy."""
        return dict(await self._j("GET", f"{_P}/cdp/json/version"))

    def cdp_endpoint(self) -> str:
        """The DevTools proxy's HTTP endpoint, for ``connect_over_cdp(url, headers=...)`` with the
        daemon's ``Authorization`` header."""
        return f"{self._host.base_url}{_P}/cdp"

    def cdp_url(self, access_token: str | None = None) -> str:
        """The DevTools proxy's WebSocket URL, with the token as ``access_token`` when given (a
        WebSocket upgrade is the only request that takes the token in the query)."""
        base = self._host.base_url
        scheme = "wss" if base.startswith("https:") else "ws"
        url = f"{scheme}:{base.split(':', 1)[1]}{_P}/cdp"
        return f"{url}?{urlencode({'access_token': access_token})}" if access_token else url
