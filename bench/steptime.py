"""The planner's step time and `launcher project` against the Compose cluster here: one markdown table each.

    python -m bench.steptime                      # both tables (about 8 minutes on 2 cores)
    python -m bench.steptime --meshes 1x1x1,2x2x2 --no-project

Each measured run is the built-in trainer on a fresh cluster (``simcluster.run``, this checkout's
code mounted), small model,
1F1B, 6 steps, step 6 traced with the traffic accounting on; its step time is the median of
steps 2-5 (untraced). Step time: `launcher plan --hardware local` (the cached calibration;
--recalibrate measures it again first) against each mesh's measured step; the order of the
meshes by speed is checked wherever their measured steps differ by more than 10%. Project: the
2x2x2 run at full bandwidth projected onto the same job under each --inter-node-bandwidth
(the shaped hardware of train/plan/hardware.py), against the runs measured under it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import simcluster
from simcluster.train.config import Config
from simcluster.train.plan.hardware import hardware, shaped
from simcluster.train.plan.predict import plan
from simcluster.train.plan.project import measured, project
from simcluster.train.plan.steptime import step_time
from simcluster.train.preflight import preflight

MESHES = ("1x1x1", "2x1x1", "1x2x1", "1x1x2", "2x2x2", "4x2x2")
RATES = ("50mbit", "200mbit")


def measure(mesh: str, run_dir: str, rate: str | None = None) -> float:
    """The median untraced step (seconds, steps 2-5) of a fresh cluster's run.

    Raises:
        RuntimeError: the run failed (its summary in the message).
    """
    extra = {"inter_node_bandwidth": rate} if rate else {}
    run = simcluster.run(mesh=mesh, model="small", steps=6, traffic=1, trace_steps="6", val_every=0,
                         run_dir=run_dir, mount_code=True, **extra)  # this checkout's code, as plan's
    if not run.ok:
        raise RuntimeError(f"{mesh} {rate or ''}: {run.summary}")
    return statistics.median(r["step_time_s"] for r in run.metrics if 2 <= r["step"] <= 5)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.steptime", description=__doc__.split("\n\n")[0])
    p.add_argument("--meshes", default=",".join(MESHES))
    p.add_argument("--no-project", action="store_true", help="skip the --inter-node-bandwidth runs")
    p.add_argument("--recalibrate", action="store_true", help="measure the local hardware model first")
    a = p.parse_args(argv)
    os.makedirs("runs", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-steptime-", dir="runs")
    hw = hardware("local", a.recalibrate)
    print(f"local: {hw.flops / 1e9:.1f} GFLOP/s a core, gloo {hw.intra_bw / 1e6:.0f} MB/s and "
          f"{1e3 * hw.latency_s:.2f} ms a message ({hw.sources[0]})\n", flush=True)
    print("| mesh | predicted s | measured s | error | load |\n|---|---|---|---|---|", flush=True)
    got = {}
    for mesh in a.meshes.split(","):
        predicted = step_time(plan(preflight(Config(model="small", mesh=mesh))), hw)[0].total
        got[mesh] = (predicted, measure(mesh, f"{tmp}/{mesh}"))
        print(f"| {mesh} | {predicted:.2f} | {got[mesh][1]:.2f} | {predicted / got[mesh][1] - 1:+.0%} | {load()} |",
              flush=True)
    wrong = [(x, y) for x in got for y in got if got[x][1] < got[y][1] / 1.1 and not got[x][0] < got[y][0]]
    print(f"\norder by speed (measured steps more than 10% apart): "
          f"{'kept' if not wrong else 'swapped: ' + ', '.join(f'{x} before {y}' for x, y in wrong)}", flush=True)
    if a.no_project:
        return 0
    base = f"{tmp}/2x2x2" if "2x2x2" in got else None
    if base is None:
        measure("2x2x2", base := f"{tmp}/2x2x2")
    m = measured(base)
    print(f"\nproject {base} (measured {m.step_s:.2f} s a step at full bandwidth):\n\n"
          "| onto | projected s | measured s | error | load |\n|---|---|---|---|---|", flush=True)
    for rate in RATES:
        target = shaped(hw, rate)
        there = project(m, hw, target)[1].total
        real = measure("2x2x2", f"{tmp}/2x2x2-{rate}", rate)
        print(f"| --inter-node-bandwidth {rate} | {there:.2f} | {real:.2f} | {there / real - 1:+.0%} | {load()} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
