"""What the stall watch and the communication record cost on the built-in trainer's steady step,
beside torch's Flight Recorder and TORCH_DISTRIBUTED_DEBUG=DETAIL.

    python -m bench.stallwatch --rounds 3 --steps 20
    python -m bench.stallwatch --rounds 1 --steps 6 --mesh 2x1x2 --settings off,watch

Each round runs the trainer once per setting, in turn (alternated, so a change of the shared
machine's load hits every setting alike), under ``torchrun --standalone --nproc-per-node
WORLD -m simcluster.train --model tiny --mesh MESH`` on this machine:

    off      --stall-s 0: Flight Recorder on (torch's default, 2000 entries), no watch, no p2p record
    watch    --stall-s 60 (the default): the p2p record, the watch thread, its store client
    no-fr    --stall-s 0 and TORCH_FR_BUFFER_SIZE=0: torch's Flight Recorder off too
    detail   --stall-s 0 and TORCH_DISTRIBUTED_DEBUG=DETAIL: torch's cross-rank fingerprint check
             of every collective (what names a shape or op mismatch before gloo sees it)

A setting's figure is the median ``step_time_s`` of rank 0's metrics.jsonl over the steps after
``--skip``, then the median over rounds; printed against ``off`` with the load average beside it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from simcluster.train.rundir import read_metrics

SETTINGS = {
    "off": ({}, "0"),
    "watch": ({}, "60"),
    "no-fr": ({"TORCH_FR_BUFFER_SIZE": "0"}, "0"),
    "detail": ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "0"),
}


def run_once(setting: str, mesh: str, steps: int, skip: int, out: str) -> float:
    """Median step_time_s (s) of the steps after ``skip`` of one trainer run with one setting."""
    extra_env, stall = SETTINGS[setting]
    world = 1
    for n in mesh.split("x"):
        world *= int(n)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra_env}
    for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_DISTRIBUTED_DEBUG"):
        if k not in extra_env:
            env.pop(k, None)
    cmd = ["torchrun", "--standalone", f"--nproc-per-node={world}", "-m", "simcluster.train", "--model", "tiny",
           "--mesh", mesh, "--steps", str(steps), "--val-every", "0", "--run-dir", out, "--stall-s", stall]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=1800)
    rows = read_metrics(out)
    return statistics.median(r["step_time_s"] for r in rows[skip:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stallwatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=3, help="steps left out at the start (default 3)")
    p.add_argument("--mesh", default="2x2x2")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    a = p.parse_args(argv)
    chosen = [s for s in a.settings.split(",") if s]
    if bad := [s for s in chosen if s not in SETTINGS]:
        p.error(f"--settings: unknown {', '.join(bad)}; choose from {', '.join(SETTINGS)}")
    got: dict[str, list[float]] = {s: [] for s in chosen}
    root = tempfile.mkdtemp(prefix="bench-stallwatch-")
    loads = []
    for r in range(a.rounds):
        for s in chosen:
            loads.append(os.getloadavg()[0])
            got[s].append(run_once(s, a.mesh, a.steps, a.skip, os.path.join(root, f"{s}-{r}")))
        print(f"[bench] round {r + 1}/{a.rounds} (load {loads[-1]:.1f}): "
              + ", ".join(f"{s} {got[s][-1] * 1e3:.1f} ms" for s in chosen), flush=True)
    base = statistics.median(got[chosen[0]])
    print(f"trainer tiny --mesh {a.mesh}, {a.steps} steps (median after {a.skip}), {a.rounds} rounds, "
          f"load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'setting':<8} {'step ms':>8} {'vs ' + chosen[0]:>9}")
    for s in chosen:
        m = statistics.median(got[s])
        print(f"{s:<8} {m * 1e3:>8.1f} {m / base:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
