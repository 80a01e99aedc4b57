"""Sandboxes from a provider: ``SandboxAgent.start(sandbox=provider)`` makes (or, with
``sandbox_id``, finds again) a sandbox running the daemon, waits until the daemon answers and
returns a connected client. Every wait is bounded; a failure is a :class:`SandboxStartError`
naming the step; a sandbox this call created is removed again when a later step fails."""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import httpx

from .errors import SandboxAgentError

if TYPE_CHECKING:
    from .local import SandboxAgent

__all__ = ["SandboxProvider", "SandboxStartError", "SandboxDetachedError", "SandboxStep", "start_sandbox"]

SandboxStep = Literal["create", "start", "health", "auth", "connect"]


@runtime_checkable
class SandboxProvider(Protocol):
    """A place that can run the daemon. Required: ``name``, ``create()`` (returns the provider's
    own id), ``destroy(id)`` and ``get_url(id)``. Optional (looked up by name): ``reconnect(id)``,
    ``pause(id)``, ``kill(id)``, ``ensure_server(id)``, ``get_token(id)``. Methods may be sync or
    async."""

    name: str

    def create(self) -> Any: ...

    def destroy(self, sandbox_id: str) -> Any: ...

    def get_url(self, sandbox_id: str) -> Any: ...


class SandboxStartError(SandboxAgentError):
    """``SandboxAgent.start(sandbox=…)`` failed at ``step``; ``__cause__`` is the provider's (or
    the daemon's) own error."""

    def __init__(self, step: SandboxStep, provider: str, sandbox_id: str | None, why: str) -> None:
        self.step: SandboxStep = step
        self.provider = provider
        self.sandbox_id = sandbox_id
        where = f" ({sandbox_id})" if sandbox_id else ""
        super().__init__(f'sandbox provider "{provider}": {step} failed{where}: {why}')


class SandboxDetachedError(SandboxAgentError):
    """A sandbox call on a client that has no sandbox (never had one, or already ended it)."""


async def call(provider: Any, method: str, *args: Any) -> Any:
    fn = getattr(provider, method, None)
    if fn is None:
        return None
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def split_id(provider: SandboxProvider, sandbox_id: str) -> str:
    prefix = f"{provider.name}/"
    if not sandbox_id.startswith(prefix):
        raise ValueError(f"sandbox id {sandbox_id!r} is not one of provider {provider.name!r} ({prefix}…)")
    return sandbox_id[len(prefix) :]


async def start_sandbox(
    *,
    sandbox: SandboxProvider,
    sandbox_id: str | None = None,
    token: str | None = None,
    agent: str = "mock",
    health_timeout: float = 120.0,
    probe_timeout: float = 5.0,
    ensure_server_after: int = 3,
    connect: bool = True,
    **client_options: Any,
) -> SandboxAgent:
    from .local import SandboxAgent

    name = sandbox.name
    created = sandbox_id is None
    raw: str | None = None
    full: str | None = None

    async def remove() -> None:
        if created and raw is not None:
            try:
                if getattr(sandbox, "kill", None) is not None:
                    await call(sandbox, "kill", raw)
                else:
                    await call(sandbox, "destroy", raw)
            except Exception:  # the start's own error is the one to raise
                pass

    async def fail(step: SandboxStep, cause: BaseException | None, why: str | None = None) -> SandboxStartError:
        await remove()
        err = SandboxStartError(step, name, full, why or f"{type(cause).__name__}: {cause}")
        err.__cause__ = cause
        return err

    # create
    if created:
        try:
            raw = str(await call(sandbox, "create"))
        except Exception as e:
            raise await fail("create", e) from e
    else:
        assert sandbox_id is not None
        raw = split_id(sandbox, sandbox_id)
    full = f"{name}/{raw}"

    # start: make it reachable
    try:
        if not created:
            await call(sandbox, "reconnect", raw)
            await call(sandbox, "ensure_server", raw)
        if token is None:
            token = await call(sandbox, "get_token", raw)
        url = str(await call(sandbox, "get_url", raw))
    except Exception as e:
        raise await fail("start", e) from e

    # health: bounded back-off; ensure_server after repeated failures; 401/403 ends the wait
    loop = asyncio.get_running_loop()
    deadline = loop.time() + health_timeout
    delay, failures = 0.2, 0
    last: BaseException | None = None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=probe_timeout) as http:
        while True:
            try:
                res = await http.get(f"{url.rstrip('/')}/v1/health")
                if res.status_code == 200:
                    break
                if res.status_code in (401, 403):
                    raise await fail("auth", None, f"the daemon answered {res.status_code} to the token")
                last = RuntimeError(f"/v1/health answered {res.status_code}")
            except httpx.HTTPError as e:
                last = e
            failures += 1
            if loop.time() + delay > deadline:
                raise await fail("health", last, f"no healthy daemon within {health_timeout} s (last: {last})")
            if failures % max(1, ensure_server_after) == 0 and getattr(sandbox, "ensure_server", None) is not None:
                try:
                    await call(sandbox, "ensure_server", raw)
                    url = str(await call(sandbox, "get_url", raw))
                except Exception as e:
                    raise await fail("start", e) from e
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    sa = SandboxAgent(url, agent=agent, token=token, **client_options)
    sa._attach(sandbox, raw)
    if connect:
        try:
            await sa.connect()
        except Exception as e:
            await sa.aclose()
            raise await fail("connect", e) from e
    return sa
