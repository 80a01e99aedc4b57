"""Files, a watch and a process with a followed log, against a running daemon (host APIs only:
no agent is started).

    sandbox-agent server --port 2468 &               # or any daemon; SANDBOX_AGENT_URL to point elsewhere
    python examples/python/files_and_processes.py
"""

from __future__ import annotations

import asyncio
import os

from sandbox_agent import HostApi, NotFoundError, WatchChange, WatchRescan


async def main() -> None:
    url = os.environ.get("SANDBOX_AGENT_URL", "http://127.0.0.1:2468")
    async with HostApi(url, token=os.environ.get("SANDBOX_AGENT_TOKEN")) as host:
        await host.mkdir("demo")
        async with host.watch("demo", recursive=True) as changes:
            first = await anext(changes)
            assert isinstance(first, WatchRescan)  # the feed is live: list the tree now
            await host.write_file("demo/hello.txt", "hello from python\n")
            while True:
                item = await asyncio.wait_for(anext(changes), 10)
                if isinstance(item, WatchChange):
                    print("change:", item.kind, item.path)
                    if item.kind == "rename":  # the write landed (temporary renamed into place)
                        break
        print("read back:", (await host.read_file("demo/hello.txt")).decode().strip())

        process = await host.create_process("sh", ["-c", "for i in 1 2 3; do echo tick $i; sleep 0.1; done"])
        async with host.follow_process_logs(process.id) as log:
            async for entry in log:
                print(f"{entry.stream}: {entry.text}", end="")
        print("exit code:", (await host.get_process(process.id)).exit_code)

        await host.delete_entry("demo", recursive=True)
        try:
            await host.stat("demo")
        except NotFoundError as e:
            print("gone:", e.status, e.title)


if __name__ == "__main__":
    asyncio.run(main())
