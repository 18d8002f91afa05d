"""The planner predicted against measured: traffic and held bytes (equal or not), peak activations
(relative error against torch's MemTracker), per mesh and schedule; one markdown table.

    python -m bench.plan [--model tiny] [--configs 2x2x2:1f1b,2x1x1:gpipe:4] [--memory]

Measured side: each rank of the real trainer alone on torch's fake process group, forked
(train/plan/measure.py), 2 steps, step 2 compared. A config is MESH:SCHEDULE[:MICROBATCHES];
default: 1F1B on every mesh of the parity matrix and every schedule on 2x2x2. --memory also runs
MemTracker around step 2 (slower; it cannot follow interleaved-zb, zbv and dualpipev, whose rows
then say so). The step time against the Compose cluster is its own benchmark: python -m
bench.steptime.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from simcluster.core.config import SCHEDULES, Config
from simcluster.train.plan.measure import measure_ranks
from simcluster.train.plan.predict import plan
from simcluster.train.plan.traffic import rank_traffic
from simcluster.train.preflight import preflight

MESHES = ("1x1x1", "1x1x2", "1x2x1", "2x1x1", "1x2x2", "2x1x2", "2x2x1", "2x2x2", "4x1x2")
SPLIT_BACKWARD = ("interleaved-zb", "zbv", "dualpipev")
DEFAULT = [f"{m}:1f1b" for m in MESHES] + [f"2x2x2:{s}" for s in SCHEDULES if s != "1f1b"]


def row(spec: str, model: str, memory: bool, corpus: str, run_dir: str) -> str:
    mesh, schedule, *mb = spec.split(":")
    run = preflight(Config(model=model, mesh=mesh, schedule=schedule, microbatches=int(mb[0]) if mb else 0, steps=2,
                           val_every=0, traffic=1, data=corpus, run_dir=run_dir))
    predicted = {r.rank: r for r in plan(run).ranks}
    track = memory and schedule not in SPLIT_BACKWARD
    got = measure_ranks(run, memory=track)
    traffic_ok = all({k: v for k, v in g["traffic"][-1].items() if k != "step"} == rank_traffic(run, g["rank"])
                     for g in got)
    held_ok = all(g["held"] == {k: getattr(predicted[g["rank"]], k) for k in ("params", "grads", "optimizer")}
                  for g in got)
    if track:
        errors = [predicted[g["rank"]].activations / g["memory"]["ACT"] - 1 for g in got]
        act = f"{min(errors):+.1%} .. {max(errors):+.1%}"
    else:
        act = "not tracked" if memory else "-"
    return (f"| {mesh} | {schedule} | {run.config.microbatches} | {'equal' if traffic_ok else 'DIFFER'} | "
            f"{'equal' if held_ok else 'DIFFER'} | {act} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--configs", dest="specs", default=",".join(DEFAULT), help="MESH:SCHEDULE[:MICROBATCHES],...")
    p.add_argument("--memory", action="store_true", help="MemTracker on every rank too (slower)")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-plan-")
    corpus = f"{tmp}/corpus.txt"
    with open(corpus, "w", encoding="utf-8") as fh:
        fh.write("the quick brown fox jumps over the lazy dog\n" * 2000)
    print("| mesh | schedule | microbatches | traffic per kind and link | params, grads, AdamW | "
          "peak activations vs MemTracker (all ranks) |\n|---|---|---|---|---|---|", flush=True)
    for spec in a.specs.split(","):
        print(row(spec, a.model, a.memory, corpus, f"{tmp}/run"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
