"""What the instruments of the user's code cost: the same script's step time with each off and on.

    python -m bench.instruments --script examples/manual_3d.py --nproc 4 --repeats 2 -- --pp 2 --tp 2 --steps 12

Each repeat runs the script once per setting, in turn, under ``torchrun --standalone`` (local
processes: the ranks' instrumentation is the same code on the cluster, without the containers'
noise): ``plain`` (torchrun alone), ``steps`` (the sitecustomize and the step clock, always on in
the cluster), ``traffic`` (``--traffic 1``) and ``trace`` (``--trace-steps`` of every step after
the first two). A setting's figure is the median of the script's own ``step_time_s`` (its
metrics.jsonl) over the steps after the first two, then the median over repeats; the table gives
each against ``plain`` with the load average beside it (these machines are shared).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from simcluster.launcher.job.files import SOURCE
from simcluster.launcher.instrument.spec import Instruments
from simcluster.core.rundir import read_metrics
from bench.args import positive

SETTINGS = ("plain", "steps", "traffic", "trace")


def run_once(script: str, nproc: int, args: list[str], setting: str, out: str, steps: int) -> float:
    """Median step_time_s (s) of steps 3.. of one run with one setting."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SIMCLUSTER_OUTPUT_DIR": out}
    for k in ("SIMCLUSTER_PP", "SIMCLUSTER_DP", "SIMCLUSTER_TP"):
        env.pop(k, None)
    if setting != "plain":
        boot = os.path.join(SOURCE, "launcher", "instrument", "boot")
        env.update(PYTHONPATH=os.pathsep.join([boot, SOURCE, env.get("PYTHONPATH", "")]), SIMCLUSTER_INSTRUMENT="1")
        env.update(Instruments(traffic=setting == "traffic",
                               trace_steps=tuple(range(3, steps + 1)) if setting == "trace" else ()).env())
    subprocess.run(["torchrun", "--standalone", f"--nproc-per-node={nproc}", script, "--out-dir", out, *args],
                   env=env, check=True, capture_output=True, timeout=1800)
    rows = read_metrics(out)
    return statistics.median(r["step_time_s"] for r in rows[2:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, job = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m bench.instruments", description=__doc__.split("\n\n")[0])
    p.add_argument("--script", default="examples/manual_3d.py")
    p.add_argument("--nproc", type=positive(int), default=4)
    p.add_argument("--repeats", type=positive(int), default=2)
    a = p.parse_args(own)
    steps = int(job[job.index("--steps") + 1]) if "--steps" in job else 5
    got: dict[str, list[float]] = {s: [] for s in SETTINGS}
    root = tempfile.mkdtemp(prefix="bench-instruments-")
    for r in range(a.repeats):
        for s in SETTINGS:
            got[s].append(run_once(a.script, a.nproc, job, s, os.path.join(root, f"{s}-{r}"), steps))
        print(f"[bench] repeat {r + 1}/{a.repeats}: " + ", ".join(f"{s} {got[s][-1] * 1e3:.1f} ms" for s in SETTINGS),
              flush=True)
    base = statistics.median(got["plain"])
    print(f"{a.script} {' '.join(job)} on {a.nproc} ranks, load average {os.getloadavg()[0]:.1f}")
    print(f"{'setting':<8} {'step ms':>8} {'vs plain':>9}")
    for s in SETTINGS:
        m = statistics.median(got[s])
        print(f"{s:<8} {m * 1e3:>8.1f} {m / base:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
