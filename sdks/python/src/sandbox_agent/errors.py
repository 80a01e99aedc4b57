"""Typed errors: every non-2xx answer of the daemon is an :class:`HttpError` (its
``application/problem+json`` body parsed), subclassed by status; errors of the agent itself
(JSON-RPC) are :class:`AgentError`."""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "SandboxAgentError",
    "HttpError",
    "NetworkError",
    "BadRequestError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "GoneError",
    "PayloadTooLargeError",
    "TooManyRequestsError",
    "AgentUnavailableError",
    "ServiceUnavailableError",
    "AgentTimeoutError",
    "AgentError",
    "UnsupportedError",
    "NotConnectedError",
    "AlreadyConnectedError",
    "PermissionReplyError",
    "StartError",
    "http_error",
]


class SandboxAgentError(Exception):
    """Base of every error this package raises."""


class HttpError(SandboxAgentError):
    """A non-2xx answer (or none at all: ``status == 0``), with its problem details."""

    def __init__(self, problem: dict[str, Any]) -> None:
        self.problem: dict[str, Any] = problem
        status = problem.get("status")
        self.status: int = status if isinstance(status, int) else 0
        self.type: str = str(problem.get("type") or "about:blank")
        self.title: str = str(problem.get("title") or "")
        detail = problem.get("detail")
        self.detail: str | None = detail if isinstance(detail, str) else None
        self.exit_code: int | None = _opt_int(problem.get("exitCode"))
        self.signal: int | None = _opt_int(problem.get("signal"))
        reason = problem.get("exitReason")
        self.exit_reason: str | None = reason if isinstance(reason, str) else None
        tail = problem.get("stderrTail")
        self.stderr_tail: str | None = tail if isinstance(tail, str) else None
        text = f"{self.status} {self.title}".strip()
        if self.detail:
            text += f": {self.detail}"
        super().__init__(text)


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class NetworkError(HttpError):
    """No HTTP answer (connection refused, reset, timed out); ``detail`` names the URL and cause."""


class BadRequestError(HttpError):
    """400."""


class UnauthorizedError(HttpError):
    """401: a missing or wrong token."""


class ForbiddenError(HttpError):
    """403."""


class NotFoundError(HttpError):
    """404."""


class ConflictError(HttpError):
    """409."""


class GoneError(HttpError):
    """410: the agent exited and everything it wrote was delivered."""


class PayloadTooLargeError(HttpError):
    """413."""


class TooManyRequestsError(HttpError):
    """429."""


class AgentUnavailableError(HttpError):
    """502: the agent exited or could not start (``exit_code``, ``exit_reason``, ``stderr_tail``)."""


class ServiceUnavailableError(HttpError):
    """503: a cap was reached or the daemon is stopping."""


class AgentTimeoutError(HttpError):
    """504: the agent did not answer within the daemon's request timeout."""


_BY_STATUS: dict[int, type[HttpError]] = {
    0: NetworkError,
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    429: TooManyRequestsError,
    502: AgentUnavailableError,
    503: ServiceUnavailableError,
    504: AgentTimeoutError,
}


def http_error(problem: dict[str, Any]) -> HttpError:
    """The :class:`HttpError` subclass for ``problem["status"]``."""
    status = problem.get("status")
    cls = _BY_STATUS.get(status if isinstance(status, int) else -1, HttpError)
    return cls(problem)


def problem_from_body(status: int, body: bytes, content_type: str, url: str) -> dict[str, Any]:
    """Parses a problem+json body; any other body becomes a synthesized problem."""
    import json

    if "json" in content_type.lower():
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            parsed.setdefault("status", status)
            parsed["status"] = status
            parsed.setdefault("title", httpx.codes.get_reason_phrase(status))
            return parsed
    text = body[:1024].decode("utf-8", "replace").strip()
    return {
        "type": "about:blank",
        "title": httpx.codes.get_reason_phrase(status) or f"HTTP {status}",
        "status": status,
        "detail": text or None,
        "url": url,
    }


def network_problem(url: str, cause: BaseException) -> dict[str, Any]:
    return {
        "type": "urn:sandbox-agent:network-error",
        "title": "Network Error",
        "status": 0,
        "detail": f"{url}: {type(cause).__name__}: {cause}",
        "url": url,
    }


class AgentError(SandboxAgentError):
    """A JSON-RPC error answered by the agent."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"agent error {code}: {message}")


class UnsupportedError(AgentError):
    """The agent does not offer this method (it did not advertise it, or answered -32601)."""

    def __init__(self, agent: str, method: str) -> None:
        self.agent = agent
        self.method = method
        super().__init__(-32601, f"{agent} does not support {method}")


class NotConnectedError(SandboxAgentError):
    """A session call on a client that is not connected (or was disconnected)."""


class AlreadyConnectedError(SandboxAgentError):
    """``connect()`` on a client that is connected or connecting: one connection per client."""


class PermissionReplyError(SandboxAgentError):
    """The permission handler returned something that is not a valid answer."""

    def __init__(self, reply: Any, why: str) -> None:
        self.reply = reply
        super().__init__(f"invalid permission reply {reply!r}: {why}")


class StartError(SandboxAgentError):
    """A local daemon could not be started; ``stderr_tail`` is the end of what it wrote."""

    def __init__(self, message: str, stderr_tail: str = "") -> None:
        self.stderr_tail = stderr_tail
        super().__init__(message + (f"\n{stderr_tail}" if stderr_tail else ""))
