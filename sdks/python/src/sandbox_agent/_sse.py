"""A bounded Server-Sent Events parser over an async byte iterator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class SseEvent:
    event: str
    data: str
    id: str | None


class SseEventTooLarge(Exception):
    pass


async def parse_sse(chunks: AsyncIterator[bytes], max_event_bytes: int) -> AsyncIterator[SseEvent]:
    """Yields each event; comments (keepalives) are skipped. An event (or line) larger than
    ``max_event_bytes`` raises :class:`SseEventTooLarge` instead of growing without bound."""
    buf = bytearray()
    event = ""
    data: list[str] = []
    size = 0
    ev_id: str | None = None
    async for chunk in chunks:
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > max_event_bytes:
                    raise SseEventTooLarge(f"an SSE line over {max_event_bytes} bytes")
                break
            raw = bytes(buf[:nl])
            del buf[: nl + 1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            line = raw.decode("utf-8", "replace")
            if not line:
                if data or event:
                    yield SseEvent(event or "message", "\n".join(data), ev_id)
                event, data, size, ev_id = "", [], 0, None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                size += len(value) + 1
                if size > max_event_bytes:
                    raise SseEventTooLarge(f"an SSE event over {max_event_bytes} bytes")
                data.append(value)
            elif field == "event":
                event = value
            elif field == "id":
                ev_id = value
