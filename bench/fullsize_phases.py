"""Where a full-size rank's memory goes: per phase its peak allocated and reserved, and what is live at the
peaks (tensors grouped by size and the phase that made them), from one trace, through memory.py's allocator.

    python -m bench.fullsize_phases /tmp/simcluster-fullsize-assets/traces/70b-fsdp32-tp8/trace-0.json [--no-expandable]

The trace is one `plan --full-size --trace-dir` wrote (bench/fullsize.py keeps its traces under its
--assets). The replay is memory.py's (the cuBLAS workspace first, one pool set a stream; expandable
segments unless --no-expandable), without record_stream (torchtitan sets TORCH_NCCL_AVOID_RECORD_STREAMS=1
itself since 2024: BENCHMARKS.md). Phases of the last step only, layer numbers folded ("layers.*") so that
a model's blocks read as one row; the row names the phase where its peak is.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

from simcluster.train.plan.fullsize.allocator import Allocator
from simcluster.train.plan.fullsize.device import CUBLAS_WORKSPACE
from simcluster.train.plan.fullsize.speed import step_of
from simcluster.train.plan.fullsize.trace import Trace, read

GiB = 1 << 30


def fold(phase: str) -> str:
    """A phase name with its step, microbatch and layer numbers folded, for grouping."""
    return re.sub(r"layers\.\d+", "layers.*", re.sub(r"^step \d+, ", "", re.sub(r", microbatch \d+", "", phase)))


def replay_phases(trace: Trace, expandable: bool) -> tuple[dict, dict, dict]:
    """(folded phase -> (max allocated, max reserved, the phase of the max)), the live set (sid -> (bytes,
    phase index)) at the peak allocated, and at the peak reserved."""
    alloc = Allocator(expandable=expandable)
    alloc.malloc(CUBLAS_WORKSPACE)
    live: dict[int, tuple] = {}
    rows: dict[str, list] = defaultdict(lambda: [0, 0, ""])
    at_a = at_r = (0, {})
    last = trace.steps
    for e in trace.events:
        if e[0] not in ("a", "f", "r"):
            continue
        if e[0] in ("f", "r") and e[1] in live:
            alloc.free(live.pop(e[1])[0])
        if e[0] in ("a", "r") and e[2] > 0:
            live[e[1]] = (alloc.malloc(e[2], e[4] if len(e) > 4 else 0), e[2], e[3])
        ph = e[2] if e[0] == "f" else e[3]
        name = trace.phases[ph]
        if step_of(name) != last:
            continue
        row = rows[fold(name)]
        if alloc.allocated > row[0]:
            row[0], row[2] = alloc.allocated, name
        row[1] = max(row[1], alloc.reserved)
        if alloc.allocated > at_a[0]:
            at_a = (alloc.allocated, {s: v[1:] for s, v in live.items()})
        if alloc.reserved > at_r[0]:
            at_r = (alloc.reserved, {s: v[1:] for s, v in live.items()})
    return dict(rows), at_a[1], at_r[1]


def live_table(trace: Trace, live: dict, top: int = 12) -> list[str]:
    """The live set grouped by (size, folded phase that made it), largest total first."""
    groups: Counter = Counter()
    counts: Counter = Counter()
    for nbytes, ph in live.values():
        key = (nbytes, fold(trace.phases[ph]))
        groups[key] += nbytes
        counts[key] += 1
    lines = [f"  {total / GiB:7.2f} GiB = {counts[k]:4d} x {k[0] / 2**20:9.1f} MiB, made in: {k[1]}"
             for k, total in groups.most_common(top)]
    rest = sum(groups.values()) - sum(t for _, t in groups.most_common(top))
    return lines + [f"  {rest / GiB:7.2f} GiB in {len(groups) - min(top, len(groups))} smaller groups",
                    f"  {sum(groups.values()) / GiB:7.2f} GiB live in all"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.fullsize_phases", description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="a trace-R.json of `plan --full-size --trace-dir`")
    ap.add_argument("--no-expandable", action="store_true", help="default segments (no expandable_segments)")
    ap.add_argument("--top", type=int, default=15, help="phases and live groups shown")
    a = ap.parse_args(argv)
    trace = read(a.trace)
    rows, at_a, at_r = replay_phases(trace, not a.no_expandable)
    print(f"rank {trace.rank} of {trace.world_size}, step {trace.steps}: phase (folded) | max allocated | "
          f"max reserved | where")
    for name, (al, re_, where) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"  {al / GiB:6.2f} | {re_ / GiB:6.2f} | {name} | {where}")
    print("live at the peak allocated:")
    print("\n".join(live_table(trace, at_a, a.top)))
    print("live at the peak reserved:")
    print("\n".join(live_table(trace, at_r, a.top)))


if __name__ == "__main__":
    main()
