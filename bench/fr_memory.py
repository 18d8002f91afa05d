"""What torch's Flight Recorder holds a rank: its RSS growth over N collectives, by TORCH_FR_BUFFER_SIZE.

    python -m bench.fr_memory
    python -m bench.fr_memory --entries 2000,250,0 --depth 30

For each buffer size, a fresh interpreter (the size is read when the first process group is made)
makes a gloo world of one, runs 50 all-reduces to warm up, then ``--calls`` all-reduces from
``--depth`` Python frames down (an entry keeps its call's Python stack), and prints the growth of its
RSS in MB. The rehearsal's default beyond 64 ranks comes from this (simcluster/core/flightrec.py
``rehearsal_entries``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r'''
import os, sys, torch, torch.distributed as dist
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
t = torch.ones(8)
for _ in range(50):
    dist.all_reduce(t)
def deep(n, calls):
    if n == 0:
        for _ in range(calls):
            dist.all_reduce(t)
        return
    deep(n - 1, calls)
r0 = rss(); deep(int(sys.argv[1]), int(sys.argv[2])); print(f"{rss() - r0:.1f}")
'''


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fr_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", default="2000,250,0", help="TORCH_FR_BUFFER_SIZE values, comma-separated")
    p.add_argument("--calls", type=int, default=2000, help="all-reduces after the warm-up (default 2000)")
    p.add_argument("--depth", type=int, default=30, help="Python frames above each call (default 30)")
    args = p.parse_args(argv)
    print("| TORCH_FR_BUFFER_SIZE | RSS growth MB |\n|---|---|")
    for n in args.entries.split(","):
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": n.strip()}
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.depth), str(args.calls)], env=env,
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        print(f"| {n.strip()} | {out} |")
    print(f"\n{args.calls} all-reduces, {args.depth} frames deep, load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
