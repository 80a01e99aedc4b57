"""SandboxAgentClient against the real daemon and its mock agent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from acp import schema
from conftest import CutProxy
from sandbox_agent import (
    AgentUnavailableError,
    AlreadyConnectedError,
    BadRequestError,
    NotConnectedError,
    PermissionRequest,
    SandboxAgent,
    SandboxAgentClient,
    SessionUpdateEvent,
    UnsupportedError,
)


def text(ev: SessionUpdateEvent) -> str:
    return str(ev.update.content.text)


async def test_fifty_chunks_arrive_in_order_before_prompt_returns(daemon: SandboxAgent, proxy: CutProxy) -> None:
    # The event stream lags 0.3 s per read behind the POSTs (through the proxy): without the
    # wait for its updates, prompt() would return before them.
    proxy.delay = 0.3
    seen: list[str] = []

    async def on_update(ev: SessionUpdateEvent) -> None:
        await asyncio.sleep(0)
        seen.append(text(ev))

    async with SandboxAgentClient(proxy.url, agent="mock", on_session_update=on_update) as c:
        s = await c.new_session()
        async with c.updates(s.session_id) as stream:
            r = await c.prompt(s.session_id, "/stream 50")
            assert r.stop_reason == "end_turn"
            assert seen == [f"chunk {i} of 50" for i in range(1, 51)]
            from_stream = [text(await stream.__anext__()) for _ in range(50)]
            assert from_stream == seen
        assert c.last_event_id is not None and c.last_event_id >= 50


async def test_permission_allowed_by_the_handler_and_rejected_by_default(daemon: SandboxAgent) -> None:
    asked: list[PermissionRequest] = []
    chunks: list[str] = []

    async def allow(req: PermissionRequest) -> str:
        asked.append(req)
        await asyncio.sleep(0.05)
        return next(o.option_id for o in req.options if o.kind == "allow_once")

    async with SandboxAgentClient(
        daemon.base_url, agent="mock", on_permission_request=allow, on_session_update=lambda e: chunks.append(text(e))
    ) as c:
        s = await c.new_session()
        await c.prompt(s.session_id, "/permission")
        assert len(asked) == 1 and asked[0].session_id == s.session_id
        assert {o.kind for o in asked[0].options} >= {"allow_once", "reject_once"}
        allowed = next(o.option_id for o in asked[0].options if o.kind == "allow_once")
        assert chunks[-1] == f"permission: {allowed}"

    # No handler: the reject_once option.
    chunks.clear()
    async with SandboxAgentClient(daemon.base_url, agent="mock", on_session_update=lambda e: chunks.append(text(e))) as c:
        s = await c.new_session()
        await c.prompt(s.session_id, "/permission")
        assert chunks[-1] == "permission: reject-once"

    # A handler that raises: the same default, and the error goes to on_error.
    chunks.clear()
    errors: list[BaseException] = []

    def boom(req: PermissionRequest) -> str:
        raise RuntimeError("handler failed")

    async with SandboxAgentClient(
        daemon.base_url,
        agent="mock",
        on_permission_request=boom,
        on_error=errors.append,
        on_session_update=lambda e: chunks.append(text(e)),
    ) as c:
        s = await c.new_session()
        await c.prompt(s.session_id, "/permission")
        assert chunks[-1] == "permission: reject-once"
        await asyncio.sleep(0)
        assert any("handler failed" in str(e) for e in errors)

    # An option that was not offered: a JSON-RPC error to the agent, PermissionReplyError to on_error.
    errors.clear()
    async with SandboxAgentClient(
        daemon.base_url, agent="mock", on_permission_request=lambda r: "no-such-option", on_error=errors.append
    ) as c:
        s = await c.new_session()
        await c.prompt(s.session_id, "/permission")
        await asyncio.sleep(0)
        assert any(type(e).__name__ == "PermissionReplyError" for e in errors)


async def test_cancel_ends_a_hanging_prompt(daemon: SandboxAgent) -> None:
    async with SandboxAgentClient(daemon.base_url, agent="mock") as c:
        s = await c.new_session()
        running = asyncio.ensure_future(c.prompt(s.session_id, "/hang"))
        await asyncio.sleep(0.3)
        assert not running.done()
        await c.cancel(s.session_id)
        r = await asyncio.wait_for(running, timeout=10)
        assert r.stop_reason == "cancelled"


async def test_crash_is_a_typed_error_with_the_exit_code(daemon: SandboxAgent) -> None:
    c = SandboxAgentClient(daemon.base_url, agent="mock")
    async with c:
        s = await c.new_session()
        with pytest.raises(AgentUnavailableError) as info:
            await c.prompt(s.session_id, "/crash 3")
        assert info.value.status == 502
        assert info.value.exit_code == 3
        assert info.value.exit_reason == "exited"
        assert info.value.problem["exitCode"] == 3
        # The stream then ends (410): the connection is over, later calls say so.
        for _ in range(100):
            if not c.connected:
                break
            await asyncio.sleep(0.05)
        assert not c.connected
        with pytest.raises(NotConnectedError):
            await c.new_session()


async def test_a_cut_stream_is_resumed_with_every_update_once(daemon: SandboxAgent, proxy: CutProxy) -> None:
    proxy.cut_after = 20_000
    proxy.cuts = 3
    seen: list[str] = []
    async with SandboxAgentClient(proxy.url, agent="mock", on_session_update=lambda e: seen.append(text(e))) as c:
        s = await c.new_session()
        r = await c.prompt(s.session_id, "/stream 2000")
        assert r.stop_reason == "end_turn"
        assert proxy.cut_done == 3
        assert c._transport is not None and c._transport.reconnects >= 3
        assert seen == [f"chunk {i} of 2000" for i in range(1, 2001)]


async def test_gap_is_reported(binary: str, tmp_path: Any) -> None:
    from conftest import start_daemon

    d = await start_daemon(binary, tmp_path, "--event-buffer", "16")
    try:
        gaps: list[Any] = []
        # Re-attach after 100 more events than the ring holds: the lost ids are a gap.
        # (A live reader may fall behind a 16-event ring too: its gaps are not this test's.)
        c2 = SandboxAgentClient(d.base_url, agent="mock", on_gap=lambda g: None)
        async with c2:
            s = await c2.new_session()
            await c2.prompt(s.session_id, "hello")
            last = c2.last_event_id
            await c2.prompt(s.session_id, "/stream 100")
            await c2.disconnect(stop_agent=False)
        c3 = SandboxAgentClient(d.base_url, agent="mock", server_id=c2.server_id, last_event_id=last,
                                on_gap=gaps.append)
        async with c3:
            for _ in range(100):
                if gaps:
                    break
                await asyncio.sleep(0.05)
        assert gaps, "no gap reported"
        assert last is not None
        assert gaps[0].from_ == last + 1
        assert gaps[0].to > gaps[0].from_
    finally:
        await d.dispose()


async def test_connection_gates_and_capabilities(daemon: SandboxAgent) -> None:
    c = SandboxAgentClient(daemon.base_url, agent="mock")
    with pytest.raises(NotConnectedError):
        await c.new_session()
    async with c:
        with pytest.raises(AlreadyConnectedError):
            await c.connect()
        assert c.agent_info is not None and c.agent_info.agent_capabilities is not None
        assert c.agent_info.agent_capabilities.load_session is True
        s = await c.new_session(title="t", metadata={"k": 1})
        assert s.record.title == "t"
        with pytest.raises(UnsupportedError):
            await c.fork_session(s.session_id)
        await c.update_session(s.session_id, title="t2")
        recs = await c.sessions.list()
        assert recs[0].title == "t2" and recs[0].metadata == {"k": 1}
        # Content blocks from acp.schema work as well as a string.
        r = await c.prompt(s.session_id, [schema.TextContentBlock(type="text", text="hi")])
        assert r.stop_reason == "end_turn"
    with pytest.raises(NotConnectedError):
        await c.prompt("x", "y")


async def test_the_daemon_session_inventory_pages_across_server_ids(daemon: SandboxAgent) -> None:
    c = SandboxAgentClient(daemon.base_url, agent="mock")
    async with c:
        a = await c.new_session()
        b = await c.new_session()
        first = await c.list_all_sessions(limit=1, server_id=c.server_id)
        assert [s.session_id for s in first.sessions] == [a.session_id]
        assert first.sessions[0].agent == "mock" and first.sessions[0].state == "live"
        assert first.next_cursor is not None
        second = await c.list_all_sessions(limit=1, cursor=first.next_cursor, server_id=c.server_id)
        assert [s.session_id for s in second.sessions] == [b.session_id]
        assert second.next_cursor is None
        with pytest.raises(BadRequestError):
            await c.list_all_sessions(cursor="not-a-cursor")
        # The mock does not advertise session/list: the daemon answers it from the inventory.
        listed = await c.list_sessions()
        assert [s.session_id for s in listed.sessions] == [a.session_id, b.session_id]


async def test_reattach_to_a_running_agent_resumes_after_last_event_id(daemon: SandboxAgent) -> None:
    first: list[str] = []
    c = SandboxAgentClient(daemon.base_url, agent="mock", on_session_update=lambda e: first.append(text(e)))
    await c.connect()
    s = await c.new_session()
    await c.prompt(s.session_id, "/stream 3")
    await c.disconnect(stop_agent=False)
    await c.aclose()
    assert first == ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]
    again: list[str] = []
    c2 = SandboxAgentClient(
        daemon.base_url, agent="mock", server_id=c.server_id, last_event_id=c.last_event_id,
        on_session_update=lambda e: again.append(text(e)),
    )
    async with c2:
        await c2.prompt(s.session_id, "/stream 2")
    assert again == ["chunk 1 of 2", "chunk 2 of 2"]
    assert all(i.server_id != c.server_id for i in await daemon.list_instances())


async def test_bad_server_id_is_a_typed_400(daemon: SandboxAgent) -> None:
    c = SandboxAgentClient(daemon.base_url, agent="mock", server_id="bad id")
    with pytest.raises(BadRequestError):
        await c.connect()
    assert not c.connected
    await c.aclose()
    _ = json


async def test_load_session_and_json_file_store_across_a_restart(daemon: SandboxAgent, tmp_path: Any) -> None:
    from sandbox_agent import JsonFileSessionStore

    store_path = tmp_path / "sessions.json"
    async with SandboxAgentClient(daemon.base_url, agent="mock", session_store=JsonFileSessionStore(store_path)) as c:
        s = await c.new_session(title="first", metadata={"ticket": 7})
        await c.prompt(s.session_id, "remember me")
        with pytest.raises(UnsupportedError):
            await c.set_session_mode(s.session_id, "plan")
    assert oct(store_path.stat().st_mode & 0o777) == "0o600"
    # "Restart": a new client, a new agent process; the record and the agent's own history remain.
    history: list[str] = []
    store = JsonFileSessionStore(store_path)
    rec = (await store.list())[0]
    assert (rec.title, rec.metadata, rec.id) == ("first", {"ticket": 7}, s.session_id)
    async with SandboxAgentClient(daemon.base_url, agent="mock", session_store=store,
                                  on_session_update=lambda e: history.append(text(e))) as c2:
        await c2.load_session(rec.id)
        await c2.prompt(rec.id, "/history")
    assert "remember me" in history[-1]


async def test_disconnect_ends_a_prompt_in_flight_with_not_connected(daemon: SandboxAgent) -> None:
    c = SandboxAgentClient(daemon.base_url, agent="mock")
    await c.connect()
    s = await c.new_session()
    running = asyncio.ensure_future(c.prompt(s.session_id, "/hang"))
    await asyncio.sleep(0.3)
    await c.disconnect()
    with pytest.raises(NotConnectedError):
        await asyncio.wait_for(running, 10)
    assert not c.connected and c.last_event_id is None
    assert all(i.server_id != c.server_id for i in await c.list_instances())
    await c.aclose()
