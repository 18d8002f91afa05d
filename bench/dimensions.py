"""What each parallel dimension costs: CPU-seconds and wall seconds a step, each dimension alone.

    python -m bench.dimensions                       # 2x2x2 small 1F1B: about 5 minutes on 2 cores
    python -m bench.dimensions --mesh 2x2x2 --rounds 1

For ``--mesh PxDxT`` this runs, in turn and ``--rounds`` times: one process (``train.reference``)
with 1 thread and with ``--cores`` threads, each dimension alone (Px1x1, 1xDx1, 1x1xT, every rank
``cores // world`` threads) and the whole mesh, all local processes under torchrun on the same
cores. A configuration's CPU a step is the CPU of all its processes (user + system of every
thread, from /proc) between the step lines of step WARMUP and the last step, over the steps
between; its wall a step is the time between those lines over the same steps. ``util`` = CPU /
wall: cores kept busy (at most ``--cores``; the pipeline bubble shows here). One process with 1
thread is the arithmetic itself; ``x arithmetic`` is a configuration's CPU against it: what its
parallelism adds, whatever the cores.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from simcluster.core.errors import ConfigError
from simcluster.core.config import parse_mesh
from simcluster.core.rundir import read_metrics
from bench.throughput import WARMUP, mesh_command, single_command
from bench.args import positive

STEP_LINE = re.compile(r"^step (\d+)/(\d+) ")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of process ``root`` and every live descendant (all their threads)."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime
    total, todo = 0.0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def configurations(mesh: str, cores: int) -> list[tuple[str, str | None, int]]:
    """(label, mesh or None for one process, threads a process) in the order they run."""
    spec = parse_mesh(mesh)
    alone = []
    for i, size in enumerate((spec.pp, spec.dp, spec.tp)):
        if size > 1:
            dims = [1, 1, 1]
            dims[i] = size
            alone.append("x".join(map(str, dims)))
    out = [("one process, 1 thread", None, 1), (f"one process, {cores} threads", None, cores)]
    for m in [*alone, mesh]:
        out.append((m, m, max(1, cores // parse_mesh(m).world_size)))
    return out


def measure_one(mesh: str | None, threads: int, model: str, schedule: str, steps: int, run_dir: str,
                extra: list[str]) -> dict:
    """One run of ``steps`` steps: CPU (core-s) and wall (s) a step after warm-up, and tokens/s.

    Raises SystemExit with the run's last output if it fails.
    """
    if mesh is None:
        cmd, env = single_command(model, steps, threads, run_dir, extra)
    else:
        cmd, env = mesh_command(mesh, model, schedule, steps, threads, run_dir, extra)
    marks, tail = {}, []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            hit = STEP_LINE.match(line)
            if hit:
                marks[int(hit.group(1))] = (time.monotonic(), tree_cpu_s(proc.pid))
    if proc.returncode != 0 or WARMUP not in marks or steps not in marks:
        sys.stderr.write("".join(tail))
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}")
    (t0, c0), (t1, c1) = marks[WARMUP], marks[steps]
    n = steps - WARMUP
    last = read_metrics(run_dir)[-1]
    tokens = last["tokens_per_s"] * last["step_time_s"]
    return {"wall_s": (t1 - t0) / n, "cpu_s": (c1 - c0) / n, "tokens_per_s": tokens * n / (t1 - t0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dimensions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", default="2x2x2")
    p.add_argument("--model", default="small")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--steps", type=positive(int), default=8, help=f"steps a run; the first {WARMUP} are warm-up")
    p.add_argument("--rounds", type=positive(int), default=2)
    p.add_argument("--cores", type=positive(int), default=os.cpu_count(),
                   help="cores shared by all processes (default: all)")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temp folder)")
    args, extra = p.parse_known_args(argv)
    if args.steps < WARMUP + 2:
        p.error(f"--steps must be at least {WARMUP + 2}, e.g. --steps 8: the first {WARMUP} are warm-up")
    try:
        configs = configurations(args.mesh, args.cores)
    except ConfigError as e:
        p.error(str(e))
    out = args.out or tempfile.mkdtemp(prefix="bench-dims-")
    results: dict[str, list[dict]] = {label: [] for label, _, _ in configs}
    for r in range(args.rounds):
        for label, mesh, threads in configs:
            load = os.getloadavg()[0]
            run_dir = os.path.join(out, f"r{r}-{mesh or 'single'}-{threads}")
            res = measure_one(mesh, threads, args.model, args.schedule, args.steps, run_dir, extra)
            results[label].append(res)
            print(f"[bench] {time.strftime('%H:%M:%S')} round {r + 1} {label}: wall {res['wall_s']:.3f} s, "
                  f"cpu {res['cpu_s']:.3f} core-s a step (load {load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
    base = statistics.median(x["cpu_s"] for x in results[configs[0][0]])
    print(f"\n{args.model}, {args.schedule}, {args.cores} cores, medians of {args.rounds} round(s):\n")
    print("| configuration | threads a process | wall s a step | tokens/s | CPU core-s a step | util | x arithmetic |")
    print("|---|---|---|---|---|---|---|")
    for label, _, threads in configs:
        wall = statistics.median(x["wall_s"] for x in results[label])
        cpu = statistics.median(x["cpu_s"] for x in results[label])
        tps = statistics.median(x["tokens_per_s"] for x in results[label])
        print(f"| {label} | {threads} | {wall:.3f} | {tps:.0f} | {cpu:.3f} | {cpu / wall:.2f} | {cpu / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
