#!/usr/bin/env bash
# grep over a generated 50,000-file tree: the daemon's GET /v1/fs/grep against `rg` and
# `git grep` on the same tree, each the median of RUNS warm runs (the tree is in the page cache
# after the first). Usage: benches/workspace_grep.sh [path/to/sandbox-agent] (default: the
# release build). Prints one line per tool; the figures go into docs/performance.md.
set -euo pipefail
BIN=${1:-target/release/sandbox-agent}
RUNS=${RUNS:-7}
FILES=${FILES:-50000}
for t in rg git curl python3; do command -v "$t" >/dev/null || { echo "needs $t" >&2; exit 1; }; done
DIR=$(mktemp -d)
trap 'kill "$DPID" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$DIR"' EXIT
TREE=$DIR/tree
python3 - "$TREE" "$FILES" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(7)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
for i in range(n):
    d = os.path.join(root, "ignored" if i % 10 == 3 else f"d{i % 500}", f"s{i % 7}")
    os.makedirs(d, exist_ok=True)
    lines = [" ".join(rnd.choice(words) for _ in range(10)) for _ in range(30)]
    if i % 100 == 0:
        lines[rnd.randrange(30)] += f" needle_{i}"
    with open(os.path.join(d, f"f{i}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
with open(os.path.join(root, ".gitignore"), "w") as f:
    f.write("ignored/\n")
PY
git -C "$TREE" init -q && git -C "$TREE" add -A && git -C "$TREE" -c user.name=b -c user.email=b@b commit -qm tree
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" server --port "$PORT" --data-dir "$DIR/data" --work-dir "$TREE" --log-format text 2>"$DIR/daemon.log" &
DPID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/v1/health" >/dev/null && break; sleep 0.1; done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
time_ms() { local s e; s=$(date +%s%N); "$@" >/dev/null || true; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
run() {
  local name=$1; shift
  "$@" >/dev/null || true # warm-up
  local t; t=$(for _ in $(seq "$RUNS"); do time_ms "$@"; done | median)
  echo "$name: ${t} ms (median of $RUNS)"
}
URL="http://127.0.0.1:$PORT/v1/fs/grep?path=$TREE&pattern=needle_%5B0-9%5D%2B&limit=100000"
echo "matches: daemon $(curl -s "$URL" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["matches"]))')," \
     "rg $(cd "$TREE" && rg -c 'needle_[0-9]+' | wc -l), git grep $(git -C "$TREE" grep -E -l 'needle_[0-9]+' | wc -l)"
run "daemon /v1/fs/grep" curl -sf "$URL"
run "rg" sh -c "cd '$TREE' && rg -n --column 'needle_[0-9]+'"
run "git grep" git -C "$TREE" grep -E -n --column 'needle_[0-9]+'
# The diff of a change to a fifth of the files (10,000 of 50,000) against `git diff` of the same
# (`--numstat` and `-p`, as the daemon runs it, untracked files not being part of this change).
python3 - "$TREE" <<'PY'
import os, sys
for d, _, files in os.walk(sys.argv[1]):
    if "/.git" in d:
        continue
    for f in files:
        if f.endswith(".txt") and int(f[1:-4]) % 5 == 1:
            with open(os.path.join(d, f), "a") as h:
                h.write("changed\n")
PY
DIFF_URL="http://127.0.0.1:$PORT/v1/git/diff?path=$TREE"
echo "diff files: daemon $(curl -s "$DIFF_URL" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["files"]))'), git $(git -C "$TREE" diff --name-only | wc -l)"
run "daemon /v1/git/diff" curl -sf "$DIFF_URL"
run "git diff --numstat + -p" sh -c "git -C '$TREE' diff --numstat && git -C '$TREE' diff -p"
echo "files: $FILES, cores: $(nproc)"
