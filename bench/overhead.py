"""The cluster against bare torchrun: one user program, the same steps, alternated rounds.

    python -m bench.overhead                              # 3 rounds of 20 steps
    python -m bench.overhead --rounds 5 --steps 30 -- --schedule 1f1b --microbatches 4
    python -m bench.overhead --off            # also the cluster with --no-simulated-gpus each round

Runs examples/pipelining.py (FSDP2 + TP + PipelineStage on a (pp, dp, tp) = (2, 2, 2) mesh) each
round twice, in alternating order: on the simulated cluster (``python -m launcher up --nodes 2
--nproc-per-node 4 --script examples/pipelining.py --mount-code --quiet``, this checkout's code)
and under bare ``torchrun --nproc-per-node 8`` on this machine (the same cores: the containers
have no CPU limit unless given). From each run: the wall time of the whole command, the time
from the command's start to step 1 done (rank 0's first metrics.jsonl row appearing, polled
every 20 ms), and the steady step time (the median of rank 0's ``step_time_s`` over the steps
after ``--skip``). Prints one markdown row a run with the load average before it, the ratios
(bare / cluster for the steady step, cluster - bare for step 1, cluster / bare for the wall;
medians over the rounds), and last one line ``steady=R``: bare torchrun's median steady step
time divided by the cluster's (1.0: no overhead per step). ``--off`` adds a third run a round, the
cluster with ``--no-simulated-gpus`` (kind ``off``), and the line ``simulated/off=R``: the
cluster's median steady step divided by that run's (1.0: the simulated GPU costs nothing per step;
issue 53's bound is 1.02). Arguments after ``--`` go to the
program (its own flags, checked by the program: a bad one fails its first run, which names its log);
a flag of its own out of range, or unknown before ``--``, exits 2 before anything starts. Needs
Docker and the trainer image; torchrun on the host.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.args import check_up_flags, positive
from simcluster.core.errors import ConfigError
from simcluster.core.rundir import METRICS, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "pipelining.py")
MESH = ("--pp", "2", "--dp", "2", "--tp", "2")


def commands(kind: str, out: str, steps: int, extra: list[str]) -> list[str]:
    """The command of one run of ``kind`` ("cluster", "off": the cluster with --no-simulated-gpus, or
    "bare") writing into ``out``."""
    program = [*MESH, "--steps", str(steps), *extra]
    if kind in ("cluster", "off"):
        off = ["--no-simulated-gpus"] if kind == "off" else []
        return [sys.executable, "-m", "launcher", "up", "--nodes", "2", "--nproc-per-node", "4", "--script", SCRIPT,
                "--mount-code", "--quiet", "--run-dir", out, *off, "--", *program]
    torchrun = shutil.which("torchrun") or "torchrun"
    return [torchrun, "--nproc-per-node", "8", SCRIPT, *program, "--out-dir", out]


def one_run(kind: str, steps: int, skip: int, extra: list[str]) -> dict:
    """One run: {"kind", "load", "wall", "step1", "steady"} (seconds). Raises RuntimeError on a failure."""
    out = os.path.join(tempfile.mkdtemp(prefix=f"bench-overhead-{kind}-"), "run")
    metrics = os.path.join(out, METRICS)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    step1 = None
    with open(out + ".log", "w") as log:
        proc = subprocess.Popen(commands(kind, out, steps, extra), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if step1 is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
                step1 = time.monotonic() - t0
            time.sleep(0.02)
    wall = time.monotonic() - t0
    rows = read_metrics(out) if os.path.exists(metrics) else []
    if proc.returncode != 0 or len(rows) != steps:
        raise RuntimeError(f"{kind} run exited {proc.returncode} with {len(rows)} of {steps} steps: {out}.log")
    steady = statistics.median(r["step_time_s"] for r in rows[skip:])
    return {"kind": kind, "load": load, "wall": wall, "step1": step1 if step1 is not None else wall, "steady": steady}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=positive(int), default=3, help="rounds, each one cluster and one bare run "
                   "(default 3)")
    p.add_argument("--steps", type=positive(int), default=20, help="steps a run (default 20)")
    p.add_argument("--skip", type=positive(int, zero=True), default=2, help="first steps left out of the steady "
                   "time (default 2)")
    p.add_argument("--off", action="store_true", help="also run the cluster with --no-simulated-gpus each round")
    argv = sys.argv[1:] if argv is None else argv
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = p.parse_args(own)  # an unknown flag before `--` is refused (exit 2), not passed to the program
    if args.steps <= args.skip:
        p.error(f"--steps {args.steps} must exceed --skip {args.skip}; e.g. --steps 20 --skip 2")
    if bad := next((a for a in extra if a.split("=")[0] in ("--pp", "--dp", "--tp", "--steps", "--out-dir")), None):
        p.error(f"{bad} after --: set by the benchmark itself (mesh 2x2x2, --steps, its run folder); drop it")
    try:
        check_up_flags(["--nodes", "2", "--nproc-per-node", "4", "--script", SCRIPT, "--mount-code", "--quiet", "--",
                        *MESH, "--steps", str(args.steps), *extra])
    except ConfigError as e:
        p.error(str(e))
    runs: list[dict] = []
    print("| round | kind | load before | wall s | to step 1 s | steady step ms |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        kinds = ("cluster", "bare", "off") if args.off else ("cluster", "bare")
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            try:
                run = one_run(kind, args.steps, args.skip, extra)
            except RuntimeError as e:  # the run's log named; its folder kept for it
                print(f"error: {e}", file=sys.stderr)
                return 1
            runs.append(run)
            print(f"| {r + 1} | {kind} | {run['load']:.1f} | {run['wall']:.1f} | {run['step1']:.1f} "
                  f"| {run['steady'] * 1000:.1f} |", flush=True)

    def med(kind: str, key: str) -> float:
        return statistics.median(x[key] for x in runs if x["kind"] == kind)

    steady = med("bare", "steady") / med("cluster", "steady")
    print(f"\nsteady step bare/cluster {steady:.3f}; to step 1 cluster - bare {med('cluster', 'step1') - med('bare', 'step1'):+.1f} s "
          f"({med('cluster', 'step1'):.1f} / {med('bare', 'step1'):.1f}); wall cluster/bare "
          f"{med('cluster', 'wall') / med('bare', 'wall'):.2f} ({med('cluster', 'wall'):.1f} / {med('bare', 'wall'):.1f} s); "
          f"load {min(x['load'] for x in runs):.1f}-{max(x['load'] for x in runs):.1f}")
    if args.off:
        print(f"steady step simulated GPU on/off {med('cluster', 'steady') / med('off', 'steady'):.3f} "
              f"({med('cluster', 'steady') * 1000:.1f} / {med('off', 'steady') * 1000:.1f} ms)")
        print(f"simulated/off={med('cluster', 'steady') / med('off', 'steady'):.3f}")
    print(f"steady={steady:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
