#!/usr/bin/env python3
"""Append throughput of the two kinds of store considered for --state-dir (docs/performance.md,
"Durable state"): an append-only file of length+CRC framed records (what src/state/log.rs does)
against SQLite (one INSERT per event, WAL), both driven from the same Python loop so that the
language's own cost is the same on both sides. Figures: events/s for 300-byte events, per sync
policy (every event synced / one sync per 100 events / never synced by us).
Usage: benches/state_store.py [DIR] (default: a temporary directory)."""
import os, sqlite3, struct, sys, tempfile, time, zlib

N = int(os.environ.get("STATE_BENCH_N", "20000"))
PAYLOAD = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":' \
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"' + b"x" * 160 + b'"}}}}'


def framed(dir, sync_every):
    path = os.path.join(dir, "events.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    t = time.perf_counter()
    for i in range(1, N + 1):
        idb = struct.pack("<Q", i)
        crc = zlib.crc32(PAYLOAD, zlib.crc32(idb))
        os.write(fd, struct.pack("<II", len(PAYLOAD), crc) + idb + PAYLOAD)
        if sync_every and i % sync_every == 0:
            os.fdatasync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    return N / dt


def sqlite(dir, sync_every):
    path = os.path.join(dir, "events.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    # every/batch: a committed transaction is synced (FULL); never: NORMAL in WAL mode syncs
    # only at checkpoints, the closest to "the OS writes back".
    db.execute("PRAGMA synchronous=%s" % ("FULL" if sync_every else "OFF"))
    db.execute("CREATE TABLE ev (id INTEGER PRIMARY KEY, data BLOB)")
    t = time.perf_counter()
    per_tx = sync_every or 1000
    db.execute("BEGIN")
    for i in range(1, N + 1):
        db.execute("INSERT INTO ev VALUES (?, ?)", (i, PAYLOAD))
        if i % per_tx == 0:
            db.execute("COMMIT")
            db.execute("BEGIN")
    db.execute("COMMIT")
    dt = time.perf_counter() - t
    db.close()
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass
    return N / dt


def main():
    dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="state-bench-")
    for name, every in (("sync every event", 1), ("sync every 100", 100), ("no sync", 0)):
        n = N // 20 if every == 1 else N
        global_n = globals()
        saved, global_n["N"] = N, n
        f = framed(dir, every)
        s = sqlite(dir, every)
        global_n["N"] = saved
        print(f"{name:18} framed file {f:10.0f} ev/s   sqlite (WAL) {s:10.0f} ev/s   ratio {f / s:5.1f}x")


if __name__ == "__main__":
    main()
