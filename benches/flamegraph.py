#!/usr/bin/env python3
"""Folds `perf script` output into stacks and draws them as a flame graph (SVG), with a text
summary: the functions with the most samples on CPU (self) and in their stacks (total), and the
share of samples under lock/futex waiting (the contention figure).

Usage: perf script -i perf.data | benches/flamegraph.py --title T --svg out.svg [--top 25]
                                                          [--folded out.folded]
Stacks are read root first; frames of the same function in a row are kept (recursion shows).
Names are shortened: Rust hashes (`::h0123…`) and closure/generic noise are dropped so that one
function is one name. Written for this repository's benchmarks (docs/performance.md); no
dependency beyond Python's standard library."""
import argparse
import collections
import html
import re
import sys

HASH = re.compile(r"::h[0-9a-f]{16}$")
GENERIC = re.compile(r"<[^<>]*>")
# `<Type as Trait>::method` → `Type::method` (the type is the informative half).
AS_TRAIT = re.compile(r"<([^<>]*?) as [^<>]*>")
LOCKY = re.compile(r"futex|lock_contended|parking|Mutex.*lock|RwLock|semaphore|Condvar|wait_on", re.I)


def short(name):
    name = HASH.sub("", name.strip())
    # Strip generic arguments from the inside out, a bounded number of times (no recursion).
    for _ in range(8):
        new = AS_TRAIT.sub(r"\1", name)
        new = GENERIC.sub("", new) if new == name else new
        if new == name:
            break
        name = new
    return name.replace("{{closure}}", "{closure}")[:160] or "?"


def read_stacks(lines):
    """Yields (comm, [frames root first]) per sample of `perf script`'s default output."""
    comm, frames = None, []
    for line in lines:
        if not line.strip():
            if comm is not None and frames:
                yield comm, list(reversed(frames))
            comm, frames = None, []
            continue
        if not line[0].isspace():
            comm = line.split()[0]
            frames = []
            continue
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            sym = parts[1].rsplit(" (", 1)[0]
            frames.append(short(sym.split("+0x")[0]))
    if comm is not None and frames:
        yield comm, list(reversed(frames))


def svg(folded, title, out, width=1600, row=16):
    total = sum(folded.values())
    # A tree of the folded stacks: node = [count, children dict].
    root = [0, {}]
    for stack, n in folded.items():
        node = root
        node[0] += n
        for f in stack:
            node = node[1].setdefault(f, [0, {}])
            node[0] += n
    rects, depth_max = [], 0
    todo = [(root, 0, 0.0, "all")]
    while todo:  # iterative: stacks can be deep
        node, depth, x, name = todo.pop()
        w = node[0] / total * width
        if w < 1.0:
            continue
        rects.append((depth, x, w, name, node[0]))
        depth_max = max(depth_max, depth)
        cx = x
        for child, sub in sorted(node[1].items()):
            todo.append((sub, depth + 1, cx, child))
            cx += sub[0] / total * width
    height = (depth_max + 3) * row
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'font-family="monospace" font-size="11">',
         f'<text x="4" y="{row - 3}">{html.escape(title)} ({total} samples)</text>']
    for depth, x, w, name, n in rects:
        y = height - (depth + 1) * row
        hue = 10 + (hash(name) % 40)
        fill = f"hsl({hue},85%,{55 + hash(name) % 15}%)"
        label = html.escape(name)
        pct = 100.0 * n / total
        o.append(f'<g><title>{label} — {n} samples, {pct:.1f} %</title>'
                 f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" fill="{fill}"/>')
        chars = int(w / 7)
        if chars > 3:
            text = label if len(name) <= chars else html.escape(name[:chars - 1]) + "…"
            o.append(f'<text x="{x + 2:.1f}" y="{y + row - 4}">{text}</text>')
        o.append("</g>")
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", default="flame graph")
    ap.add_argument("--svg")
    ap.add_argument("--folded")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--comm", help="only samples of this command (thread name prefix)")
    a = ap.parse_args()
    folded = collections.Counter()
    for comm, frames in read_stacks(sys.stdin):
        if a.comm and not comm.startswith(a.comm):
            continue
        folded[tuple(frames)] += 1
    total = sum(folded.values())
    if not total:
        sys.exit("flamegraph.py: no samples read")
    self_ = collections.Counter()
    incl = collections.Counter()
    locky = 0
    for stack, n in folded.items():
        self_[stack[-1]] += n
        for f in set(stack):
            incl[f] += n
        if any(LOCKY.search(f) for f in stack):
            locky += n
    print(f"{total} samples; under lock/futex frames: {100.0 * locky / total:.1f} %")
    print(f"\nself (on CPU in the function itself), top {a.top}:")
    for f, n in self_.most_common(a.top):
        print(f"  {100.0 * n / total:5.1f} %  {f}")
    print(f"\ntotal (in the stack), this crate's functions, top {a.top}:")
    ours = [(f, n) for f, n in incl.most_common() if "sandbox_agent" in f]
    for f, n in ours[:a.top]:
        print(f"  {100.0 * n / total:5.1f} %  {f}")
    if a.folded:
        with open(a.folded, "w") as f:
            for stack, n in folded.most_common():
                f.write(";".join(stack) + f" {n}\n")
    if a.svg:
        svg(folded, a.title, a.svg)


if __name__ == "__main__":
    main()
