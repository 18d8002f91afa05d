"""Rank memory at scale: the peak of the summed PSS and RSS of a cluster's ranks, and its time to the end.

    python -m bench.memory --mesh 2x2x2
    python -m bench.memory --mesh 16x8x2 --n-layers 16 --global-batch 128 --timeout-s 600

Runs ``python -m launcher up --model tiny --steps 3 --mount-code --quiet`` (this checkout's code)
and, every ``--every-s`` seconds until it exits, sums ``Pss`` and ``Rss`` of
/proc/PID/smaps_rollup over every process of the nodes: the node wrappers, torchrun's agents
forked from them, the agents' fork servers and the ranks (those whose command line holds
``simcluster.launcher.container.node`` or ``.forkrun``: the containers' processes are this
machine's; since the wrapper forks the agent, fe7b271, forkrun's own name matched none of them).
PSS counts a page shared by the forked ranks of a node once, split among them; RSS counts it in
each. Prints one markdown row: mesh, ranks, peak PSS (MB, and MB a rank), peak RSS,
seconds from the command to its exit, and the exit code. Needs Docker and the trainer image.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from simcluster.train.errors import ConfigError
from simcluster.train.config import parse_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the node wrapper (it imports torch and forks the agent), the agent, its fork server and the ranks all carry
# the wrapper's command line; forkrun's own for a forkrun started directly
MATCH = (b"simcluster.launcher.container.node", b"simcluster.train.forkrun")


def summed_kb() -> tuple[int, int, int]:
    """(PSS kB, RSS kB, processes) summed over this machine's processes whose argv holds MATCH."""
    pss = rss = n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read()
            if not any(m in argv for m in MATCH):
                continue
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                fields = dict(line.split(":", 1) for line in fh if line.startswith(("Pss:", "Rss:")))
        except OSError:  # gone meanwhile
            continue
        pss, rss, n = pss + int(fields["Pss"].split()[0]), rss + int(fields["Rss"].split()[0]), n + 1
    return pss, rss, n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", required=True, help="pp x dp x tp, e.g. 8x4x2")
    p.add_argument("--every-s", type=float, default=1.0, help="seconds between samples (default 1)")
    args, up_flags = p.parse_known_args(argv)
    try:
        world = parse_mesh(args.mesh).world_size
    except ConfigError as e:
        p.error(str(e))
    run_dir = os.path.join(tempfile.mkdtemp(prefix="bench-memory-"), "run")
    cmd = [sys.executable, "-m", "launcher", "up", "--mesh", args.mesh, "--model", "tiny", "--steps", "3",
           "--mount-code", "--quiet", "--run-dir", run_dir, *up_flags]
    t0 = time.monotonic()
    with open(run_dir + ".log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        peak = (0, 0, 0)
        while proc.poll() is None:
            pss, rss, n = summed_kb()
            peak = (max(peak[0], pss), max(peak[1], rss), max(peak[2], n))
            time.sleep(args.every_s)
    wall = time.monotonic() - t0
    pss_mb, rss_mb = peak[0] / 1024, peak[1] / 1024
    print("| mesh | ranks | peak PSS MB (a rank) | peak RSS MB | processes | to the end s | exit |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.mesh} | {world} | {pss_mb:.0f} ({pss_mb / world:.0f}) | {rss_mb:.0f} | {peak[2]} | {wall:.0f} "
          f"| {proc.returncode} |")
    if proc.returncode != 0:
        print(f"`{' '.join(cmd)}` exited {proc.returncode}: {run_dir}.log", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
