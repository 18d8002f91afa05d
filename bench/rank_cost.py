"""What a rank's CPU goes to at scale: its stall watch thread, the rest of the rank, the rendezvous store.

    python -m bench.rank_cost --mesh 8x4x2 --global-batch 32
    python -m bench.rank_cost --mesh 8x4x2 --global-batch 32 --stall-s 0
    python -m bench.rank_cost --mesh 16x16x2 --n-layers 16 --global-batch 256 --timeout-s 900 --every-s 20

Flags it does not know go to `launcher up`, checked as `up` checks them before anything starts.
Runs ``python -m launcher up --model tiny --steps 3 --mount-code --quiet`` (this checkout's code) and,
every ``--every-s`` seconds until it exits, reads from /proc the CPU time (user + system) of every
process of the job (the node wrappers, agents, fork servers and ranks: bench/memory.py's MATCH) and
of the rendezvous (its TCPStore serves every rank's store calls, the watch's among them), and of
every thread named ``sc-stallwatch`` (each rank's stall watch names its OS thread so:
train/stallwatch.py THREAD_NAME). The counters are cumulative, so each process's and thread's last
reading counts; what a process spent after its last sample is not seen (at most ``--every-s`` of it).

Prints one markdown row: the wall time, the steps done and the last step's time (summary.json), the
ranks' CPU seconds (summed and a rank), the watch threads' (summed, a rank, and their share of the
ranks'), the rendezvous's, and the load average at the end. Needs Docker and the trainer image.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.args import check_up_flags, positive
from bench.memory import MATCH, RENDEZVOUS
from simcluster.core.config import parse_mesh
from simcluster.core.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
WATCH = "sc-stallwatch"


def _cpu_s(stat_path: str) -> float | None:
    """utime + stime (s) of a /proc stat file; None when gone."""
    try:
        with open(stat_path) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def sample(seen: dict) -> None:
    """One walk of /proc into ``seen``: {"job": {pid: s}, "rdzv": {pid: s}, "watch": {tid: s}}, the
    latest cumulative CPU seconds of each process or thread."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read()
        except OSError:
            continue
        kind = "rdzv" if RENDEZVOUS in argv else "job" if any(m in argv for m in MATCH) else None
        if kind is None or (cpu := _cpu_s(f"/proc/{pid}/stat")) is None:
            continue
        seen[kind][pid] = cpu
        if kind == "job":
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                        named = fh.read().strip() == WATCH
                except OSError:
                    continue
                if named and (t := _cpu_s(f"/proc/{pid}/task/{tid}/stat")) is not None:
                    seen["watch"][tid] = t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rank_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", required=True, help="pp x dp x tp, e.g. 8x4x2")
    p.add_argument("--every-s", type=positive(float), default=5.0, help="seconds between /proc walks (default 5)")
    args, up_flags = p.parse_known_args(argv)
    base = ["--mesh", args.mesh, "--model", "tiny", "--steps", "3", "--mount-code", "--quiet", *up_flags]
    try:
        world = parse_mesh(args.mesh).world_size
        check_up_flags(base)  # before any folder or cluster
    except ConfigError as e:
        p.error(str(e))
    run_dir = os.path.join(tempfile.mkdtemp(prefix="bench-rank-cost-"), "run")
    cmd = [sys.executable, "-m", "launcher", "up", *base, "--run-dir", run_dir]
    seen: dict = {"job": {}, "rdzv": {}, "watch": {}}
    t0 = time.monotonic()
    with open(run_dir + ".log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            sample(seen)
            time.sleep(args.every_s)
    wall = time.monotonic() - t0
    try:
        with open(os.path.join(run_dir, "summary.json")) as fh:
            summary = json.load(fh)
    except (OSError, ValueError):
        summary = {}
    job, watch, rdzv = (sum(seen[k].values()) for k in ("job", "watch", "rdzv"))
    share = f"{100 * watch / job:.2f}%" if job else "-"
    print("| command | exit | wall s | steps, last step s | job CPU s (a rank) | watch threads CPU s (a rank; share) "
          "| rendezvous CPU s | load at the end |\n|---|---|---|---|---|---|---|---|")
    print(f"| `up {' '.join(base)}` | {proc.returncode} | {wall:.0f} | {summary.get('steps')}, "
          f"{summary.get('step_time_s') or 0:.1f} | {job:.0f} ({job / world:.2f}) | {watch:.1f} ({watch / world:.3f}; "
          f"{share}) | {rdzv:.1f} | {os.getloadavg()[0]:.1f} |")
    print(f"\nlog: {run_dir}.log; {len(seen['watch'])} watch threads seen of {world} ranks")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
