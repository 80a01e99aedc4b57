#!/usr/bin/env bash
# A/B benchmark harness: the previous build against the current tree, on the same machine, in
# one run. Builds the commit named in benches/ab-baseline (in release, in a detached git worktree
# under target/ab with its own CARGO_TARGET_DIR) beside the current tree, then runs the benches
# (files, acp, processes) alternately against each daemon binary, N rounds, each time with the
# SAME bench client (the current tree's, pointed at a daemon by SANDBOX_AGENT_BIN). For every
# figure it prints the ratio current/previous (higher is better: latencies are given as their
# inverse, round trips per second) as the median and min..max over the rounds, and each build's
# ratio to the physical reference the bench measured beside it (dd, tar, nginx, a direct pipe).
#
# Usage: benches/ab.sh [--rounds N] [--quick] [--check RATIO] [--only files,acp,processes]
#                      [--baseline REV] [--keep-logs]
#   --rounds N      alternating rounds (default 5; 3 with --quick)
#   --quick         the short version CI runs: smaller files and fewer round trips per figure
#   --check RATIO   exit 1 when a figure's median ratio current/previous is below RATIO
#                   (CI uses 0.8: it fails on a gross regression only)
#   --confirm       with --check: a figure below RATIO has its bench group run again (as many
#                   rounds) and fails only if the median over all its rounds is still below
#                   (one unlucky round on a busy machine is not a regression; a real one stays)
#   --only LIST     bench groups to run (default files,acp,processes,scale)
#   --baseline REV  compare against REV instead of the commit in benches/ab-baseline
# Exit: 0 fine; 1 a regression (with --check) or a bench failed against the current build;
# 2 usage; 3 the baseline commit is not in this clone; 4 a bench failed against the previous build.
# Needs git, python3, cargo; nginx for the GET reference (skipped when missing). Everything it
# builds or writes stays under target/ab, except the files bench's scratch and data when
# BENCH_DIR / FILES_BENCH_DATA are set (e.g. on a tmpfs, to see the daemon's own cost without the
# disk's). The full run is by hand (docs/performance.md).
set -euo pipefail

rounds= quick=0 check= confirm=0 only=files,acp,processes,scale baseline=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --check) check=$2; shift 2 ;;
    --confirm) confirm=1; shift ;;
    --only) only=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ab.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$rounds" ] || rounds=$([ "$quick" = 1 ] && echo 3 || echo 5)

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
ab=$root/target/ab
mkdir -p "$ab"
if [ -z "$baseline" ]; then
  baseline=$(grep -v '^[[:space:]]*#' benches/ab-baseline | head -n1 | tr -d '[:space:]')
fi
sha=$(git rev-parse --verify --quiet "$baseline^{commit}") || {
  echo "ab.sh: the baseline $baseline is not a commit of this repository (a shallow clone?)" >&2
  exit 3
}
short=${sha:0:9}
say() { echo "== ab: $*" >&2; }

# --- the previous build: its own worktree and target directory, built once per commit.
base_bin=$ab/sandbox-agent-$short
if [ ! -x "$base_bin" ]; then
  src=$ab/src-$short
  if [ ! -d "$src" ]; then
    git worktree prune
    git worktree add --detach --quiet "$src" "$sha"
  fi
  say "building the previous build $short (release) in $src"
  (cd "$src" && CARGO_TARGET_DIR=$ab/target cargo build --release --quiet --bin sandbox-agent)
  cp "$ab/target/release/sandbox-agent" "$base_bin.part"
  mv "$base_bin.part" "$base_bin"
fi

# --- the current tree: the daemon and the bench clients (release).
say "building the current tree (release) and the benches"
benches=()
for b in ${only//,/ }; do
  case "$b" in
    files|acp|processes|scale) benches+=("$b") ;;
    *) echo "ab.sh: unknown bench group $b" >&2; exit 2 ;;
  esac
done
# The daemon on its own, as it ships: `cargo bench` builds it with the dev-dependencies' features
# unified in (tokio's test-util among them), which the previous build does not have either.
cargo build --release --quiet --bin sandbox-agent
cur_bin=$ab/sandbox-agent-current
cp target/release/sandbox-agent "$cur_bin.part" && mv "$cur_bin.part" "$cur_bin"
bench_args=()
for b in "${benches[@]}"; do bench_args+=(--bench "$b"); done
declare -A exe
while IFS= read -r line; do
  case "$line" in
    *'"target":{'*'"kind":["bench"]'*'"executable":"'*)
      name=${line#*\"name\":\"}; name=${name%%\"*}
      path=${line#*\"executable\":\"}; path=${path%%\"*}
      exe[$name]=$path ;;
  esac
done < <(cargo bench --no-run --quiet --message-format=json "${bench_args[@]}" 2>/dev/null)
for b in "${benches[@]}"; do
  [ -n "${exe[$b]:-}" ] || { echo "ab.sh: no executable for bench $b" >&2; exit 2; }
done

# --- the knobs of each bench: the full run, or the short one CI takes.
export BENCH_AB=1 RUST_LOG=warn
export FILES_BENCH_DATA=${FILES_BENCH_DATA:-$ab/data} BENCH_DIR=${BENCH_DIR:-$ab/tmp}
mkdir -p "$FILES_BENCH_DATA" "$BENCH_DIR"
if [ "$quick" = 1 ]; then
  export BENCH_RUNS=1 FILES_BENCH_MIB=256 FILES_BENCH_DIRS=30
  export ACP_BENCH_N=3000 ACP_BENCH_DUR_MS=5000 ACP_BENCH_STREAM_N=100000 ACP_BENCH_ONLY=http,sse,wscore
  export PROC_BENCH_BYTES=$((64 << 20)) PROC_BENCH_RUNS=100
  export SCALE_AGENTS=300 SCALE_LISTED=0 SCALE_FULL=0 SCALE_SUBSCRIBERS=2000 SCALE_CONNS=2000
  export SCALE_H2=100 SCALE_WS=100 SCALE_PROCS=100
else
  export BENCH_RUNS=1 FILES_BENCH_MIB=${FILES_BENCH_MIB:-1024} FILES_BENCH_DIRS=${FILES_BENCH_DIRS:-100}
  export ACP_BENCH_N=${ACP_BENCH_N:-20000} ACP_BENCH_DUR_MS=${ACP_BENCH_DUR_MS:-5000}
  export ACP_BENCH_STREAM_N=${ACP_BENCH_STREAM_N:-100000} ACP_BENCH_ONLY=${ACP_BENCH_ONLY:-http,sse,wscore}
  export PROC_BENCH_BYTES=${PROC_BENCH_BYTES:-$((256 << 20))} PROC_BENCH_RUNS=${PROC_BENCH_RUNS:-300}
  export SCALE_AGENTS=${SCALE_AGENTS:-1000} SCALE_LISTED=${SCALE_LISTED:-0} SCALE_FULL=${SCALE_FULL:-0}
  export SCALE_SUBSCRIBERS=${SCALE_SUBSCRIBERS:-5000} SCALE_CONNS=${SCALE_CONNS:-5000}
  export SCALE_H2=${SCALE_H2:-500} SCALE_WS=${SCALE_WS:-500} SCALE_PROCS=${SCALE_PROCS:-300}
fi
# The scale bench holds thousands of sockets on both sides of loopback.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

run_dir=$ab/run-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$run_dir"
results=$run_dir/figures.tsv
: > "$results"
say "previous $short ($base_bin), current $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'); $rounds rounds; logs in $run_dir"
say "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$(date +%s)
# measure FIRST LAST GROUP...: rounds FIRST..LAST of these bench groups, both builds each round.
measure() {
  local first=$1 last=$2 r b side bin log sides
  shift 2
  for ((r = first; r <= last; r++)); do
    # Alternate which build goes first, so that a drift in the machine's load hits both alike.
    if ((r % 2)); then sides="current previous"; else sides="previous current"; fi
    for b in "$@"; do
      for side in $sides; do
        bin=$([ "$side" = current ] && echo "$cur_bin" || echo "$base_bin")
        log=$run_dir/$b-$side-$r.log
        if ! SANDBOX_AGENT_BIN=$bin "${exe[$b]}" --bench >"$log" 2>&1; then
          echo "ab.sh: bench $b against the $side build failed in round $r (see $log):" >&2
          tail -n 20 "$log" >&2
          # Against the previous build that is the harness's problem (exit 4), not this tree's.
          if [ "$side" = previous ]; then exit 4; fi
          exit 1
        fi
        grep '^AB	' "$log" | sed "s/^AB	/$side	$r	$b	/" >>"$results" || true
      done
    done
    say "round $r/$last done ($(($(date +%s) - started)) s, load $(cut -d' ' -f1 /proc/loadavg))"
  done
}
measure 1 "$rounds" "${benches[@]}"
say "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- the table: per figure, current/previous per round (same round, so the same conditions).
table() {
python3 - "$results" "${check:-0}" "$short" "$run_dir/below" <<'PY'
import sys, statistics
path, check, short, below = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
fig = {}    # name -> side -> round -> (value, ref name, ref value)
group = {}  # name -> bench group
order = []
for line in open(path):
    side, rnd, grp, name, value, ref, refv = line.rstrip("\n").split("\t")
    if name not in fig:
        fig[name] = {"current": {}, "previous": {}}
        order.append(name)
    group[name] = grp
    fig[name][side][int(rnd)] = (float(value), ref, float(refv))

def spread(xs):
    xs = sorted(xs)
    return f"{statistics.median(xs):.2f} ({xs[0]:.2f}..{xs[-1]:.2f})"

print(f"| figure (higher is better) | current/previous ({short}): median (min..max) | current | previous | current vs reference | previous vs reference |")
print("|---|---|---|---|---|---|")
failed = []
for name in order:
    cur, prev = fig[name]["current"], fig[name]["previous"]
    both = sorted(set(cur) & set(prev))
    c_med = statistics.median(v[0] for v in cur.values()) if cur else 0
    p_med = statistics.median(v[0] for v in prev.values()) if prev else 0
    ref = next((v[1] for v in list(cur.values()) + list(prev.values()) if v[1] != "-"), None)
    def vs(side):
        xs = [v[0] / v[2] for v in side.values() if v[2] > 0]
        return f"{spread(xs)} x {ref}" if xs and ref else "-"
    if both:
        ratios = [cur[r][0] / prev[r][0] for r in both if prev[r][0] > 0]
        shown = spread(ratios)
        med = statistics.median(ratios)
        if check and med < check:
            failed.append((name, med))
            shown += f" **below {check}**"
    else:
        shown = "n/a (one build lacks it)"
    print(f"| {name} | {shown} | {c_med:.0f} | {p_med:.0f} | {vs(cur)} | {vs(prev)} |")
with open(below, "w") as f:
    for name, med in failed:
        f.write(f"{group[name]}\t{name}\t{med:.2f}\n")
sys.exit(1 if failed else 0)
PY
}
if table; then exit 0; fi
if [ "$confirm" = 1 ]; then
  again=$(cut -f1 "$run_dir/below" | sort -u | tr '\n' ' ')
  say "below $check: $(cut -f2,3 "$run_dir/below" | tr '\t\n' '= ' ); confirming with $rounds more rounds of: $again"
  # shellcheck disable=SC2086
  measure $((rounds + 1)) $((rounds * 2)) $again
  echo
  echo "After the confirmation rounds (ratios over all rounds):"
  if table; then exit 0; fi
fi
while IFS=$'\t' read -r _ name med; do
  echo "REGRESSION: $name: median current/previous $med < $check" >&2
done <"$run_dir/below"
exit 1
