"""Prompt round trip and stream throughput: the Python SDK against the TypeScript SDK, on the
same daemon and mock agent (not a test; figures go to docs/performance.md).

    cd sdks/python && .venv/bin/python bench/bench.py [--rounds 3] [--prompts 500] [--chunks 10000]
    SANDBOX_AGENT_BIN=../../target/release/sandbox-agent .venv/bin/python bench/bench.py

Needs the TypeScript SDK built (cd sdks/typescript && npm ci && npm run build) and node. Per
round and client: 50 warm-up prompts, PROMPTS timed round trips at concurrency 1 (`hello`: one
update, then the answer; `prompt()` returns once the update was delivered), then one
`/stream CHUNKS` timed until `prompt()` returned with every chunk delivered. The clients take
turns within each round; the table shows the median over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sandbox_agent import SandboxAgentClient, start_local

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent


async def python_round(url: str, server_id: str, prompts: int, chunks: int, wait: bool) -> dict[str, float]:
    got = 0

    def count(_: Any) -> None:
        nonlocal got
        got += 1

    async with SandboxAgentClient(url, agent="mock", server_id=server_id, on_session_update=count,
                                  wait_for_updates=wait) as c:
        s = await c.new_session(cwd="/")
        for _ in range(50):
            await c.prompt(s.session_id, "warm up")
        lat = []
        cpu0 = time.process_time()
        for _ in range(prompts):
            t0 = time.perf_counter()
            await c.prompt(s.session_id, "hello")
            lat.append((time.perf_counter() - t0) * 1000)
        cpu_per_prompt = (time.process_time() - cpu0) * 1000 / prompts
        lat.sort()
        got = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        await c.prompt(s.session_id, f"/stream {chunks}")
        while got < chunks:  # only without the wait (wait_for_updates=False)
            await asyncio.sleep(0)
        stream_ms = (time.perf_counter() - t0) * 1000
        stream_cpu = (time.process_time() - cpu0) * 1000
    return {
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "streamMs": stream_ms,
        "cpuPerPrompt": cpu_per_prompt,
        "streamCpuMs": stream_cpu,
    }


async def httpx_round(url: str, server_id: str, prompts: int, chunks: int) -> dict[str, float]:
    """The floor under the Python SDK: the same prompt POSTs through httpx alone (no SSE reader,
    no ACP layer, no wait for updates), so no stream figure."""
    import httpx

    path = f"{url}/v1/acp/{server_id}"
    n = 0

    async def post(h: httpx.AsyncClient, method: str, params: dict[str, Any], first: bool = False) -> Any:
        nonlocal n
        n += 1
        body = json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params})
        r = await h.post(path + ("?agent=mock" if first else ""), content=body,
                         headers={"content-type": "application/json"})
        r.raise_for_status()
        return r.json()["result"]

    async with httpx.AsyncClient() as h:
        await post(h, "initialize", {"protocolVersion": 1, "clientCapabilities": {}}, first=True)
        sid = (await post(h, "session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
        for _ in range(50):
            await post(h, "session/prompt", prompt)
        lat = []
        cpu0 = time.process_time()
        for _ in range(prompts):
            t0 = time.perf_counter()
            await post(h, "session/prompt", prompt)
            lat.append((time.perf_counter() - t0) * 1000)
        cpu_per_prompt = (time.process_time() - cpu0) * 1000 / prompts
        await h.delete(path)
    lat.sort()
    nan = float("nan")
    return {"p50": lat[len(lat) // 2], "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "streamMs": nan, "cpuPerPrompt": cpu_per_prompt, "streamCpuMs": nan}


async def ts_round(url: str, server_id: str, prompts: int, chunks: int) -> dict[str, float]:
    p = await asyncio.create_subprocess_exec(
        "node", str(HERE / "ts_driver.mjs"), url, server_id, str(prompts), str(chunks),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"ts_driver.mjs failed: {err.decode()}")
    result: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--chunks", type=int, default=10_000)
    a = ap.parse_args()
    binary = os.environ.get("SANDBOX_AGENT_BIN", str(REPO / "target/debug/sandbox-agent"))
    sa = await start_local(binary_path=binary, connect=False, args=["--log-level", "warn"])
    clients = {
        "httpx alone (prompt POSTs only)": lambda r: httpx_round(sa.base_url, f"bench-httpx-{r}", a.prompts, a.chunks),
        "Python `sandbox-agent`": lambda r: python_round(sa.base_url, f"bench-py-{r}", a.prompts, a.chunks, True),
        "Python, `wait_for_updates=False`": lambda r: python_round(
            sa.base_url, f"bench-pynw-{r}", a.prompts, a.chunks, False
        ),
        "TypeScript `sandbox-agent`": lambda r: ts_round(sa.base_url, f"bench-ts-{r}", a.prompts, a.chunks),
    }
    results: dict[str, list[dict[str, float]]] = {k: [] for k in clients}
    try:
        for r in range(a.rounds):
            load = os.getloadavg()[0]
            for name, run in clients.items():
                res = await run(r)
                results[name].append(res)
                print(f"round {r + 1} (load {load:.2f}) {name}: p50 {res['p50']:.2f} ms, p99 {res['p99']:.2f} ms, "
                      f"CPU {res['cpuPerPrompt']:.2f} ms/prompt, {a.chunks} chunks {res['streamMs']:.0f} ms "
                      f"(CPU {res['streamCpuMs']:.0f} ms)", file=sys.stderr)
    finally:
        await sa.dispose()
    print(f"| client | prompt p50 (ms) | prompt p99 (ms) | client CPU per prompt (ms) | {a.chunks:,} chunks (ms) "
          "| chunks/s | client CPU for the stream (ms) |")
    print("|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        def med(key: str) -> float:
            return statistics.median(x[key] for x in rs)

        ms = med("streamMs")
        if ms == ms:  # not NaN
            stream = f"{ms:.0f} | {a.chunks / ms * 1000:,.0f} | {med('streamCpuMs'):.0f}"
        else:
            stream = "— | — | —"
        print(f"| {name} | {med('p50'):.2f} | {med('p99'):.2f} | {med('cpuPerPrompt'):.2f} | {stream} |")


if __name__ == "__main__":
    asyncio.run(main())
