"""Start a local daemon, stream a prompt's updates as they come, answer a permission request.

    pip install ./sdks/python
    python examples/python/agent_session.py           # `sandbox-agent` on PATH
    SANDBOX_AGENT_BIN=target/debug/sandbox-agent python examples/python/agent_session.py
"""

from __future__ import annotations

import asyncio
import os

from sandbox_agent import PermissionRequest, SessionUpdateEvent, start_local


def show(event: SessionUpdateEvent) -> None:
    update = event.update
    if update.session_update == "agent_message_chunk":
        print(f"[{event.event_id}] {update.content.text}")


async def approve(request: PermissionRequest) -> str:
    # A real program would ask its user; this one allows once.
    print("permission asked:", [o.option_id for o in request.options])
    return next(o.option_id for o in request.options if o.kind == "allow_once")


async def main() -> None:
    binary = os.environ.get("SANDBOX_AGENT_BIN", "sandbox-agent")
    async with start_local(binary_path=binary, on_session_update=show, on_permission_request=approve) as sa:
        session = await sa.new_session(title="example")
        answer = await sa.prompt(session.session_id, "/stream 5")
        print("stop reason:", answer.stop_reason)
        answer = await sa.prompt(session.session_id, "/permission")
        print("stop reason:", answer.stop_reason)
        # The same updates as an async iterator, for one session:
        async with sa.updates(session.session_id) as updates:
            await sa.prompt(session.session_id, "hello")
            event = await anext(updates)
            print("from the stream:", event.update.content.text)


if __name__ == "__main__":
    asyncio.run(main())
