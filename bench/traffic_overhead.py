"""What traffic accounting costs: tokens/s with --traffic 0 and 1 in alternating local mesh runs.

    python -m bench.traffic_overhead --mesh 2x1x2 --model tiny --repeats 3

Each repeat runs the mesh once without and once with accounting (torchrun, local processes),
takes the median tokens/s of the steps after warm-up, and prints both medians and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from bench.throughput import run_mesh, steady_tokens_per_s
from simcluster.core.config import parse_mesh
from bench.args import positive


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.traffic_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--mesh", default="2x1x2")
    p.add_argument("--model", default="tiny")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--steps", type=positive(int), default=8, help="steps per run; the first 2 are warm-up")
    p.add_argument("--repeats", type=positive(int), default=3)
    a = p.parse_args(argv)
    out = tempfile.mkdtemp(prefix="bench-traffic-")
    threads = 1 if parse_mesh(a.mesh).world_size > 1 else 2
    got: dict[int, list[float]] = {0: [], 1: []}
    for r in range(a.repeats):
        for on in (0, 1):
            recs = run_mesh(a.mesh, a.model, a.schedule, a.steps, threads, f"{out}/t{on}-{r}", [f"--traffic={on}"])
            got[on].append(steady_tokens_per_s(recs))
        print(f"[bench] repeat {r + 1}/{a.repeats}: off {got[0][-1]:.0f}, on {got[1][-1]:.0f} tokens/s", flush=True)
    off, on = statistics.median(got[0]), statistics.median(got[1])
    print(f"mesh {a.mesh}, model {a.model}: accounting off {off:.0f} tokens/s, on {on:.0f} tokens/s, on/off {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
