"""Rank memory at scale: the peak of the summed PSS of a cluster's processes and of the machine, a rank broken down.

    python -m bench.memory --mesh 2x2x2
    python -m bench.memory --mesh 16x8x2 --n-layers 16 --global-batch 128 --timeout-s 600

Flags it does not know go to `launcher up`, checked as `up` checks them before anything starts.
Runs ``python -m launcher up --model tiny --steps 3 --mount-code --quiet --memory-probe 1`` (this
checkout's code) and, every ``--every-s`` seconds until it exits, sums ``Pss`` and ``Rss`` of
/proc/PID/smaps_rollup over every process of this machine and over the job's: the node wrappers,
torchrun's agents forked from them, the agents' fork servers and the ranks (their command line holds
``simcluster.launcher.container.node`` or ``.forkrun``; the containers' processes are this
machine's) and the rendezvous. PSS counts a page shared by the forked ranks of a node once, split
among them; RSS counts it in each. At the sample of the job's peak it splits the job's PSS by role
(wrapper, agent, fork server, ranks, rendezvous; a process's role from its parent).

Then a rank broken down: each rank's RUN_DIR/memory/rank-R.jsonl (train/memprobe.py) gives its
PSS and USS at each milestone (start: the forked interpreter and torch; process group: the world's
gloo pairs, buffers and threads; mesh: the DeviceMesh's groups; model: model and optimizer; step N),
and the table gives the median over the ranks of each milestone and of its growth over the one
before, with threads and sockets, and the ranks' PSS summed at that milestone (each rank's own
reading). Under a load of hundreds one /proc walk takes many seconds and the sampled peak can
miss the ranks' last steps; the summed milestone is then the better figure of the ranks. Prints markdown tables and the time to step 1 (the first rank's
"step 1" mark after the command started). Needs Docker and the trainer image.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.args import check_up_flags, positive
from simcluster.core.errors import ConfigError
from simcluster.core.config import parse_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the node wrapper (it imports torch and forks the agent), the agent, its fork server and the ranks all carry
# the wrapper's command line; forkrun's own for a forkrun started directly
MATCH = (b"simcluster.launcher.container.node", b"simcluster.train.forkrun")
RENDEZVOUS = b"simcluster.launcher.container.rendezvous"
ROLES = ("wrapper", "agent", "fork server", "ranks", "rendezvous")


def _read(pid: str) -> tuple[bytes, int, int, int] | None:
    """(argv, parent pid, PSS kB, RSS kB) of a process, None when gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read()
        with open(f"/proc/{pid}/stat") as fh:
            ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            kb = dict(line.split(":", 1) for line in fh if line.startswith(("Pss:", "Rss:")))
    except (OSError, IndexError, ValueError):  # gone meanwhile, or a kernel thread (no rollup)
        return None
    if "Pss" not in kb:
        return None
    return argv, ppid, int(kb["Pss"].split()[0]), int(kb["Rss"].split()[0])


def sample() -> dict:
    """One walk of /proc: the machine's PSS, the job's PSS and RSS, its processes, and its PSS by role (kB)."""
    procs = {pid: info for pid in filter(str.isdigit, os.listdir("/proc")) if (info := _read(pid))}
    job = {pid: v for pid, v in procs.items() if any(m in v[0] for m in MATCH)}
    parent = {pid: str(v[1]) for pid, v in job.items()}

    def depth(pid: str) -> int:  # 0 the wrapper, 1 its agent, 2 the fork server, 3 a rank
        d = 0
        while parent.get(pid) in job and d < 4:
            pid, d = parent[pid], d + 1
        return d

    roles = dict.fromkeys(ROLES, 0)
    for pid, v in job.items():
        roles[ROLES[min(depth(pid), 3)]] += v[2]
    rdzv = [v for v in procs.values() if RENDEZVOUS in v[0]]
    roles["rendezvous"] = sum(v[2] for v in rdzv)
    return {"machine_pss": sum(v[2] for v in procs.values()), "job_pss": sum(roles.values()),
            "job_rss": sum(v[3] for v in job.values()) + sum(v[3] for v in rdzv), "processes": len(job), "roles": roles}


def breakdown(run_dir: str, t0_wall: float) -> tuple[list[str], float | None]:
    """Markdown rows of the ranks' milestones (median over ranks) and the seconds from ``t0_wall``
    (the command's start, time.time()) to the first rank's "step 1" mark."""
    by_mark: dict[str, list[dict]] = {}
    for path in glob.glob(os.path.join(run_dir, "memory", "rank-*.jsonl")):
        prev = None
        with open(path) as fh:
            for rec in map(json.loads, fh):
                rec["d_pss"] = rec["pss_kb"] - (prev["pss_kb"] if prev else 0)
                rec["d_uss"] = rec["uss_kb"] - (prev["uss_kb"] if prev else 0)
                by_mark.setdefault(rec["mark"], []).append(rec)
                prev = rec
    rows = ["| milestone | ranks | PSS MB | USS MB | +PSS MB | +USS MB | threads | sockets | malloc held MB "
            "| summed PSS MB |", "|---|---|---|---|---|---|---|---|---|---|"]

    def med(recs, key, scale=1024):
        vals = [r[key] for r in recs if key in r]
        return statistics.median(vals) / scale if vals else float("nan")

    for name, recs in by_mark.items():
        rows.append(f"| {name} | {len(recs)} | {med(recs, 'pss_kb'):.1f} | {med(recs, 'uss_kb'):.1f} | "
                    f"{med(recs, 'd_pss'):+.1f} | {med(recs, 'd_uss'):+.1f} | {med(recs, 'threads', 1):.0f} | "
                    f"{med(recs, 'sockets', 1):.0f} | {med(recs, 'malloc_held_kb'):.1f} | "
                    f"{sum(r['pss_kb'] for r in recs) / 1024:.0f} |")
    first = min((r["t"] for r in by_mark.get("step 1", [])), default=None)
    return rows, (first - t0_wall if first is not None else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", required=True, help="pp x dp x tp, e.g. 8x4x2")
    p.add_argument("--every-s", type=positive(float), default=2.0, help="seconds between samples (default 2)")
    args, up_flags = p.parse_known_args(argv)
    try:
        world = parse_mesh(args.mesh).world_size
        check_up_flags(["--mesh", args.mesh, "--model", "tiny", "--steps", "3", "--mount-code", "--quiet",
                        "--memory-probe", "1", *up_flags])  # before any folder or cluster
    except ConfigError as e:
        p.error(str(e))
    run_dir = os.path.join(tempfile.mkdtemp(prefix="bench-memory-"), "run")
    cmd = [sys.executable, "-m", "launcher", "up", "--mesh", args.mesh, "--model", "tiny", "--steps", "3",
           "--mount-code", "--quiet", "--memory-probe", "1", "--run-dir", run_dir, *up_flags]
    t0, t0_wall = time.monotonic(), time.time()
    peak, machine = {"job_pss": 0}, 0
    with open(run_dir + ".log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            s = sample()
            peak, machine = (s if s["job_pss"] > peak["job_pss"] else peak), max(machine, s["machine_pss"])
            time.sleep(args.every_s)
    wall = time.monotonic() - t0
    rows, to_step1 = breakdown(run_dir, t0_wall)
    mb = lambda kb: kb / 1024  # noqa: E731
    print(f"`{' '.join(cmd[1:])}`, load {os.getloadavg()[0]:.1f} at the end\n")
    print("| mesh | ranks | machine peak PSS MB | job peak PSS MB (a rank) | job RSS MB | processes | to step 1 s "
          "| to the end s | exit |")
    print("|---|---|---|---|---|---|---|---|---|")
    step1 = f"{to_step1:.0f}" if to_step1 is not None else "-"
    print(f"| {args.mesh} | {world} | {mb(machine):.0f} | {mb(peak['job_pss']):.0f} ({mb(peak['job_pss']) / world:.0f}) "
          f"| {mb(peak.get('job_rss', 0)):.0f} | {peak.get('processes', 0)} | {step1} | {wall:.0f} | {proc.returncode} |")
    if "roles" in peak:
        print("\nthe job's peak PSS by role (MB): " + ", ".join(f"{k} {mb(v):.0f}" for k, v in peak["roles"].items()))
    print("\n" + "\n".join(rows))
    if proc.returncode != 0:
        print(f"`{' '.join(cmd)}` exited {proc.returncode}: {run_dir}.log", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
