"""Drives the official Python ACP SDK's HTTP or WebSocket client (unmodified) against
`/v1/agents/mock/acp`: initialize -> session/new -> prompt with streamed updates -> a permission
request answered -> cancel of a `/hang` prompt -> close. Prints one JSON line with what it saw;
exits non-zero on any failure. Usage: python3 py-client.py http|ws <base-url> [token]
"""

import asyncio
import json
import sys
from typing import Any

import acp
from acp.http import create_http_stream
from acp.schema import AllowedOutcome, RequestPermissionResponse
from acp.ws import create_websocket_stream


class InteropClient:
    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {}
        self.permission_asked = 0

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any):
        self.permission_asked += 1
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if getattr(update, "session_update", None) == "agent_message_chunk":
            self.texts.setdefault(session_id, []).append(update.content.text)

    def on_connect(self, conn: Any) -> None:
        pass


async def wait_in_flight(base: str, headers: dict[str, str] | None) -> None:
    import httpx

    async with httpx.AsyncClient(headers=headers) as http:
        for _ in range(1000):
            servers = (await http.get(f"{base}/v1/acp")).json()["servers"]
            if any(s["pendingRequests"] > 0 for s in servers):
                return
            await asyncio.sleep(0.01)
    raise RuntimeError("the /hang prompt never reached the agent")


async def main() -> None:
    mode, base = sys.argv[1], sys.argv[2]
    token = sys.argv[3] if len(sys.argv) > 3 else None
    headers = {"Authorization": f"Bearer {token}"} if token else None
    url = f"{base}/v1/agents/mock/acp"
    if mode == "ws":
        transport = await create_websocket_stream(url.replace("http", "ws", 1), headers=headers)
    else:
        transport = create_http_stream(url, headers=headers)
    client = InteropClient()
    conn = acp.connect_to_agent(client, transport)
    init = await conn.initialize(protocol_version=1)
    session = await conn.new_session(cwd="/tmp", mcp_servers=[])
    sid = session.session_id
    streamed = await conn.prompt(session_id=sid, prompt=[acp.text_block("/stream 3")])
    permission = await conn.prompt(session_id=sid, prompt=[acp.text_block("/permission")])
    hang = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[acp.text_block("/hang")]))
    # The HTTP client POSTs concurrently, so wait until the daemon has written the prompt to the
    # agent (a request in flight in GET /v1/acp) before cancelling it.
    await wait_in_flight(base, headers)
    await conn.cancel(session_id=sid)
    cancelled = await hang
    result = {
        "agent": init.agent_info.name if init.agent_info else None,
        "sessionId": sid,
        "streamedStop": streamed.stop_reason,
        "texts": client.texts.get(sid, []),
        "permissionAsked": client.permission_asked,
        "permissionStop": permission.stop_reason,
        "cancelledStop": cancelled.stop_reason,
    }
    await conn.close()
    print(json.dumps(result), flush=True)


asyncio.run(asyncio.wait_for(main(), 30))
