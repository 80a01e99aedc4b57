#!/usr/bin/env python3
"""Writer throughput of --state-dir through the real daemon (docs/performance.md, "Durable state",
"The writer under a burst"): a daemon binary on a fresh state dir, the built-in mock agent told to
`/stream N` (N session/update notifications as fast as it can write them), the turn's POST timed
from send to answer. Figures per --state-sync policy: events/s and MB/s of the burst, and how many
of the N events are in the state dir's events.log once the daemon stopped (a build that gives up
on durability under the burst shows fewer). A/B: run it once per binary.

Usage: benches/state_writer.py [BINARY ...]   (default: target/release/sandbox-agent)
Env: STATE_WRITER_N (200000), STATE_WRITER_ROUNDS (3), STATE_WRITER_POLICIES (every,batch:100,os),
     STATE_WRITER_DIR (where the state dirs go; default a temporary directory)."""
import json, os, shutil, socket, struct, subprocess, sys, tempfile, time, urllib.request

N = int(os.environ.get("STATE_WRITER_N", "200000"))
ROUNDS = int(os.environ.get("STATE_WRITER_ROUNDS", "3"))
POLICIES = os.environ.get("STATE_WRITER_POLICIES", "every,batch:100,os").split(",")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, server_id, msg, agent=None):
    q = "?agent=" + agent if agent else ""
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/acp/%s%s" % (port, server_id, q),
        data=json.dumps(msg).encode(),
        headers={"content-type": "application/json", "accept": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def wait_up(port, proc):
    for _ in range(500):
        if proc.poll() is not None:
            raise SystemExit("the daemon exited: %s" % proc.stderr.read().decode()[-2000:])
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/v1/health" % port, timeout=1).read()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit("the daemon did not come up")


def records(path):
    """(count, last id) of an events.log."""
    n, last = 0, 0
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + 16 <= len(data):
        ln, _crc, ident = struct.unpack_from("<IIQ", data, at)
        if at + 16 + ln > len(data):
            break
        n, last = n + 1, ident
        at += 16 + ln
    return n, len(data)


def one(binary, policy, base):
    state = os.path.join(base, "state")
    shutil.rmtree(state, ignore_errors=True)
    work = os.path.join(base, "work")
    os.makedirs(work, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_AGENT_", "NOTIFY_"))}
    proc = subprocess.Popen(
        [binary, "server", "--port", str(port), "--data-dir", os.path.join(base, "data"),
         "--work-dir", work, "--state-dir", state, "--state-sync", policy,
         "--event-buffer", str(N + 1000), "--event-buffer-bytes", "512MiB",
         "--state-max-bytes", "2GiB", "--log-level", "warn"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_up(port, proc)
        post(port, "w", {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                         "params": {"protocolVersion": 1, "clientCapabilities": {}}}, agent="mock")
        sid = post(port, "w", {"jsonrpc": "2.0", "id": 1, "method": "session/new",
                               "params": {"cwd": "/", "mcpServers": []}})["result"]["sessionId"]
        t = time.perf_counter()
        post(port, "w", {"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                         "params": {"sessionId": sid,
                                    "prompt": [{"type": "text", "text": "/stream %d" % N}]}})
        dt = time.perf_counter() - t
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = os.path.join(state, "acp", "w", "events.log")
    n, size = records(log) if os.path.exists(log) else (0, 0)
    return N / dt, size / dt / 1e6, n


def main():
    binaries = sys.argv[1:] or ["target/release/sandbox-agent"]
    base = os.environ.get("STATE_WRITER_DIR") or tempfile.mkdtemp(prefix="state-writer-")
    print("N=%d events per burst, %d rounds (median shown, min..max)" % (N, ROUNDS))
    print("| binary | --state-sync | events/s | MB/s | events on disk |")
    print("| --- | --- | --- | --- | --- |")
    for policy in POLICIES:
        results = {b: [] for b in binaries}
        for _ in range(ROUNDS):
            for b in binaries:  # alternated, so both see the same machine
                results[b].append(one(b, policy, base))
        for b in binaries:
            r = results[b]
            ev = sorted(x[0] for x in r)
            mb = sorted(x[1] for x in r)
            disk = sorted(x[2] for x in r)
            mid = len(r) // 2
            print("| %s | `%s` | %.0f (%.0f..%.0f) | %.1f (%.1f..%.1f) | %d (%d..%d) |" % (
                b, policy, ev[mid], ev[0], ev[-1], mb[mid], mb[0], mb[-1], disk[mid], disk[0],
                disk[-1]))


if __name__ == "__main__":
    main()
