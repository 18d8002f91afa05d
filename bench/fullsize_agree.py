"""The built-in trainer's full-size plan against today's analytic planner, on a few meshes and model sizes.

    python -m bench.fullsize_agree [--gpu h100-96g] [--cases 2x2x2:small:4,...]

Each case (MESH:MODEL:MICROBATCHES[:SCHEDULE], model a preset, or DIMxLAYERS for --dim/--n-layers on
`small`; schedule 1f1b unless named)
runs `launcher plan --full-size` of the built-in trainer (two steps, the traces kept), then compares
every traced rank with the analytic plan of the same run (train/plan/fullsize/agree.py: the
tolerances and their reasons). Prints the table of BENCHMARKS.md, "Full size against the analytic
plan", the load average beside it; exit 1 when a rank misses.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

CASES = ("1x2x1:small:1", "2x1x1:small:4", "2x2x2:small:4", "4x1x1:small:8", "4x1x1:small:4:gpipe",
         "2x1x1:small:4:interleaved-1f1b", "2x1x2:1024x8:4", "4x2x1:1024x8:8")


def _flags(case: str) -> list[str]:
    mesh, model, m, *schedule = case.split(":")
    size = ["--model", model] if "x" not in model else \
        ["--model", "small", "--dim", model.split("x")[0], "--n-layers", model.split("x")[1]]
    return ["--mesh", mesh, *size, "--microbatches", m, "--steps", "2", *(["--schedule", *schedule] if schedule else [])]


def run_case(case: str, gpu: str, where: str, ranks: str | None = None):
    """The full-size run of ``case`` (its traces in ``where``) and its agreement rows."""
    from simcluster.core.flags import add_config_args, config_from_args
    from simcluster.train.plan.fullsize.agree import agreement
    from simcluster.train.plan.fullsize.device import constants
    from simcluster.train.plan.fullsize.trace import read
    from simcluster.train.preflight import preflight

    flags = _flags(case)
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", *flags, "--gpu", gpu, "--trace-dir", where]
    if ranks:
        cmd += ["--ranks", ranks]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    ap = argparse.ArgumentParser()
    add_config_args(ap)
    run = preflight(config_from_args(ap.parse_args(flags)), world_size=None)
    traces = {int(f[6:-5]): read(os.path.join(where, f)) for f in os.listdir(where) if f.startswith("trace-")}
    return agreement(run, traces, constants(gpu))


def main(argv: list[str] | None = None) -> int:
    from simcluster.train.plan.fullsize.agree import to_text

    ap = argparse.ArgumentParser(prog="python -m bench.fullsize_agree")
    ap.add_argument("--gpu", default="h100-96g")
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args(argv)
    missed = []
    for case in a.cases.split(","):
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as where:
            rows = run_case(case, a.gpu, where)
        mesh, _, m, *sched = case.split(":")
        pp, m = int(mesh.split("x")[0]), int(m)
        book = f", textbook bubble {(pp - 1) / (m + pp - 1):.3f}" if pp > 1 and (sched or ["1f1b"])[0] in ("1f1b", "gpipe") else ""
        print(f"{case} on {a.gpu} ({time.monotonic() - t0:.0f} s here, load {os.getloadavg()[0]:.1f}{book})")
        print(to_text(rows), flush=True)
        missed += [m for r in rows for m in r.misses()]
    print("\n".join(missed) if missed else "every rank agrees within the tolerances")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
