"""The planner's step time and `launcher project` against the Compose cluster here: one markdown table each.

    python -m bench.steptime                      # both tables (about 16 minutes on 2 cores)
    python -m bench.steptime --meshes 1x1x1,2x2x2 --no-project
    python -m bench.steptime --meshes 2x2x2 --no-project --search 2x2x2,1x4x2,2x1x4,4x2x1

Each measured run is the built-in trainer on a fresh cluster (``simcluster.run``, this checkout's
code mounted), small model, 1F1B, 6 steps; its step time is the median of steps 2-5. Step time:
`launcher plan --hardware local` (the cached calibration, --recalibrate measures it again first;
each pp stage's overhead measured on the fake process group) against each mesh's measured step
(no instruments on), in ``--rounds`` rounds (every mesh once, then again: a mesh's prediction and
its measured step are the medians over its rounds, each round's shown; one cluster's step moves
by 10-25% from run to run on this shared machine, BENCHMARKS.md); the order of the meshes by
speed is checked wherever their measured steps differ by more than 10%. --search: `plan
--search`'s 1F1B order against those meshes measured likewise, in as many rounds. Project (runs
with the traffic accounting on and step 6 traced, what project reads): the 2x2x2 run at full bandwidth projected onto the same job under each --inter-node-bandwidth
(the shaped hardware of simcluster/core/hardware.py), against the runs measured under it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import simcluster
from simcluster.core.config import Config, parse_mesh
from simcluster.core.hardware import shaped
from simcluster.train.plan.lookup import hardware
from simcluster.train.plan.measure import overhead_for
from simcluster.train.plan.search import search
from simcluster.train.plan.predict import plan
from simcluster.train.plan.project import measured, project
from simcluster.train.plan.steptime import step_time
from simcluster.train.preflight import preflight
from bench.args import positive

MESHES = ("1x1x1", "2x1x1", "1x2x1", "1x1x2", "2x2x2", "4x2x2")
RATES = ("50mbit", "200mbit")


def measure(mesh: str, run_dir: str, rate: str | None = None, records: bool = False) -> float:
    """The median step (seconds, steps 2-5) of a fresh cluster's run; ``records``: with the traffic
    accounting on and step 6 traced, what `project` reads (the accounting's dispatch mode runs on
    every step, so the step-time table measures without it, as a user's run is).

    Raises:
        RuntimeError: the run failed (its summary in the message).
    """
    extra = {"inter_node_bandwidth": rate} if rate else {}
    if records:
        extra.update(traffic=1, trace_steps="6")
    run = simcluster.run(mesh=mesh, model="small", steps=6, val_every=0,
                         run_dir=run_dir, mount_code=True, **extra)  # this checkout's code, as plan's
    if not run.ok:
        raise RuntimeError(f"{mesh} {rate or ''}: {run.summary}")
    return statistics.median(r["step_time_s"] for r in run.metrics if 2 <= r["step"] <= 5)


def order(got: dict[str, tuple[float, float]]) -> str:
    """Whether the predicted order of {mesh: (predicted s, measured s)} is the measured one wherever
    the measured steps are more than 10% apart: "(...): kept", else the pairs swapped; either way
    the pairs closer than that which the prediction orders otherwise, named (not a failure)."""
    wrong = [(x, y) for x in got for y in got if got[x][1] < got[y][1] / 1.1 and not got[x][0] < got[y][0]]
    close = [(x, y) for x in got for y in got if got[y][1] / 1.1 <= got[x][1] < got[y][1] and not got[x][0] < got[y][0]]
    return ("(measured steps more than 10% apart): "
            + ("kept" if not wrong else "swapped: " + ", ".join(f"{x} before {y}" for x, y in wrong))
            + "".join(f"; {x} measured {got[y][1] / got[x][1] - 1:.0%} faster than {y}, predicted slower" for x, y in close))


def search_order(hw, candidates: list[str], tmp: str, rounds: int) -> None:
    """`plan --search --world-size N` (1F1B rows) against each candidate mesh measured (``rounds``
    fresh clusters each, the median): the search's rank of each, and whether its order is the
    measured one wherever steps differ by more than 10%."""
    world = parse_mesh(candidates[0]).world_size
    found, _ = search(Config(model="small"), world, hw)
    ranked = [c.mesh for c in found if c.schedule == "1f1b"]
    print(f"\nsearch --world-size {world}: its 1F1B order {', '.join(ranked)}\n\n"
          "| mesh | search rank (1F1B) | predicted s | measured s | load |\n|---|---|---|---|---|", flush=True)
    runs = {mesh: [] for mesh in candidates}
    for i in range(rounds):
        for mesh in candidates:
            runs[mesh].append((measure(mesh, f"{tmp}/search-{mesh}-{i + 1}"), load()))
    got = {}
    for mesh in candidates:
        c = next(c for c in found if c.mesh == mesh and c.schedule == "1f1b")
        got[mesh] = (c.step.total, statistics.median(s for s, _ in runs[mesh]))
        print(f"| {mesh} | {ranked.index(mesh) + 1} | {got[mesh][0]:.2f} | {got[mesh][1]:.2f} {each([s for s, _ in runs[mesh]])} | "
              f"{' / '.join(ld for _, ld in runs[mesh])} |", flush=True)
    print(f"\nthe search's order {order(got)}", flush=True)


def each(values: list[float]) -> str:
    """Each round's seconds, "(2.41, 2.47)"; empty for one round."""
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")" if len(values) > 1 else ""


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.steptime", description=__doc__.split("\n\n")[0])
    p.add_argument("--meshes", default=",".join(MESHES))
    p.add_argument("--rounds", type=positive(int), default=2, help="fresh clusters a mesh, alternating (default 2)")
    p.add_argument("--no-project", action="store_true", help="skip the --inter-node-bandwidth runs")
    p.add_argument("--recalibrate", action="store_true", help="measure the local hardware model first")
    p.add_argument("--search", default="", metavar="MESHES",
                   help="also measure these meshes of one world size (e.g. 2x2x2,1x4x2,2x1x4,4x2x1) against "
                        "plan --search's order")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: give 1 or more, e.g. --rounds 2")
    os.makedirs("runs", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-steptime-", dir="runs")
    hw = hardware("local", a.recalibrate)
    print(f"local: {hw.flops / 1e9:.1f} GFLOP/s a core, gloo {hw.intra_bw / 1e6:.0f} MB/s and "
          f"{1e3 * hw.latency_s:.2f} ms a message ({hw.sources[0]})\n", flush=True)
    meshes = a.meshes.split(",")
    rows = {mesh: [] for mesh in meshes}  # mesh -> per round (overhead, predicted s, measured s, load)
    for i in range(a.rounds):
        for mesh in meshes:
            p = plan(preflight(Config(model="small", mesh=mesh)))
            overhead = overhead_for(p, hw)
            rows[mesh].append((overhead, step_time(p, hw, overhead)[0].total,
                               measure(mesh, f"{tmp}/{mesh}-{i + 1}"), load()))
            print(f"round {i + 1}: {mesh} predicted {rows[mesh][-1][1]:.2f} s, measured {rows[mesh][-1][2]:.2f} s",
                  file=sys.stderr, flush=True)
    print("| mesh | overhead a pp stage | predicted s | measured s | error | load |\n|---|---|---|---|---|---|", flush=True)
    got = {}
    for mesh, runs in rows.items():
        got[mesh] = (statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs))
        overheads = " / ".join(" ".join(f"{o:.2f}" for o in r[0]) for r in runs)
        print(f"| {mesh} | {overheads} | {got[mesh][0]:.2f} {each([r[1] for r in runs])} | "
              f"{got[mesh][1]:.2f} {each([r[2] for r in runs])} | {got[mesh][0] / got[mesh][1] - 1:+.0%} | "
              f"{' / '.join(r[3] for r in runs)} |", flush=True)
    print(f"\norder by speed {order(got)}", flush=True)
    if a.search:
        search_order(hw, a.search.split(","), tmp, a.rounds)
    if a.no_project:
        return 0
    measure("2x2x2", base := f"{tmp}/2x2x2-records", records=True)
    m = measured(base)
    print(f"\nproject {base} (measured {m.step_s:.2f} s a step at full bandwidth):\n\n"
          "| onto | projected s | measured s | error | load |\n|---|---|---|---|---|", flush=True)
    for rate in RATES:
        target = shaped(hw, rate)
        there = project(m, hw, target)[1].total
        real = measure("2x2x2", f"{tmp}/2x2x2-{rate}", rate, records=True)
        print(f"| --inter-node-bandwidth {rate} | {there:.2f} | {real:.2f} | {there / real - 1:+.0%} | {load()} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
