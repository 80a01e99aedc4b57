"""Client-side session metadata: one :class:`SessionRecord` per (server id, session id)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from .models import Model

__all__ = ["SessionRecord", "SessionStore", "InMemorySessionStore", "JsonFileSessionStore", "now_iso"]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class SessionRecord(Model):
    id: str
    agent: str
    server_id: str
    title: str | None = None
    created_at: str
    updated_at: str
    last_event_id: int | None = None
    metadata: dict[str, Any] | None = None


class SessionStore(Protocol):
    async def get(self, server_id: str, id: str) -> SessionRecord | None: ...
    async def set(self, record: SessionRecord) -> None: ...
    async def delete(self, server_id: str, id: str) -> None: ...
    async def list(self) -> list[SessionRecord]: ...


def _newest_first(records: list[SessionRecord]) -> list[SessionRecord]:
    return sorted(records, key=lambda r: r.updated_at, reverse=True)


class InMemorySessionStore:
    """The default store: records live as long as the process."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], SessionRecord] = {}

    async def get(self, server_id: str, id: str) -> SessionRecord | None:
        r = self._records.get((server_id, id))
        return r.model_copy(deep=True) if r else None

    async def set(self, record: SessionRecord) -> None:
        self._records[(record.server_id, record.id)] = record.model_copy(deep=True)

    async def delete(self, server_id: str, id: str) -> None:
        self._records.pop((server_id, id), None)

    async def list(self) -> list[SessionRecord]:
        return _newest_first([r.model_copy(deep=True) for r in self._records.values()])


class JsonFileSessionStore:
    """Records in one JSON file, rewritten whole on each change (temporary file + rename, mode
    0600), one change at a time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = asyncio.Lock()

    def _load(self) -> dict[tuple[str, str], SessionRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        out: dict[tuple[str, str], SessionRecord] = {}
        for item in raw.get("records", []):
            r = SessionRecord.model_validate(item)
            out[(r.server_id, r.id)] = r
        return out

    def _save(self, records: dict[tuple[str, str], SessionRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"records": [r.model_dump(by_alias=True, exclude_none=True) for r in records.values()]}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def get(self, server_id: str, id: str) -> SessionRecord | None:
        async with self._lock:
            return (await asyncio.to_thread(self._load)).get((server_id, id))

    async def set(self, record: SessionRecord) -> None:
        async with self._lock:
            records = await asyncio.to_thread(self._load)
            records[(record.server_id, record.id)] = record
            await asyncio.to_thread(self._save, records)

    async def delete(self, server_id: str, id: str) -> None:
        async with self._lock:
            records = await asyncio.to_thread(self._load)
            if records.pop((server_id, id), None) is not None:
                await asyncio.to_thread(self._save, records)

    async def list(self) -> list[SessionRecord]:
        async with self._lock:
            return _newest_first(list((await asyncio.to_thread(self._load)).values()))
