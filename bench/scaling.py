"""Scaling table: tokens/s, efficiency and peak RSS per rank for several meshes, one model.

    python -m bench.scaling --model small --meshes 1x1x1,2x1x1,1x2x1,1x1x2,2x2x2,4x2x2

Every mesh runs as local processes sharing all cores (``cores // world_size`` threads per rank,
at least 1); efficiency is its tokens/s over the single-process baseline measured in the same
invocation (median of the baseline runs taken before and after the meshes). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from bench.throughput import run_mesh, run_single, steady_tokens_per_s
from simcluster.core.config import parse_mesh
from bench.args import positive


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--meshes", default="1x1x1,2x1x1,1x2x1,1x1x2,2x2x2,4x2x2")
    p.add_argument("--steps", type=positive(int), default=6, help="steps per run; the first 2 are warm-up")
    p.add_argument("--cores", type=positive(int), default=os.cpu_count())
    p.add_argument("--out", default=None)
    args, extra = p.parse_known_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="scaling-")
    single = [steady_tokens_per_s(run_single(args.model, args.steps, args.cores, f"{out}/single-0", extra))]
    rows = []
    for mesh in args.meshes.split(","):
        world = parse_mesh(mesh).world_size
        threads = max(1, args.cores // world)
        recs = run_mesh(mesh, args.model, args.schedule, args.steps, threads, f"{out}/{mesh}", extra)
        rss = [max(v) for v in zip(*(r["rss_mb"] for r in recs))]
        rows.append((mesh, world, threads, steady_tokens_per_s(recs), max(rss)))
        print(f"[scaling] {mesh}: {rows[-1][3]:.0f} tokens/s, peak RSS/rank {rows[-1][4]:.0f} MB", flush=True)
    single.append(steady_tokens_per_s(run_single(args.model, args.steps, args.cores, f"{out}/single-1", extra)))
    base = statistics.median(single)
    print(f"\nmodel {args.model}, schedule {args.schedule}, {args.cores} cores; single process "
          f"({args.cores} threads): {base:.0f} tokens/s (runs: {', '.join(f'{s:.0f}' for s in single)})\n")
    print("| mesh | ranks | threads/rank | tokens/s | efficiency | peak RSS per rank (MB) |")
    print("|---|---|---|---|---|---|")
    for mesh, world, threads, tps, rss in rows:
        print(f"| {mesh} | {world} | {threads} | {tps:.0f} | {tps / base:.2f} | {rss:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
