"""What the stall watch and the communication record cost on the built-in trainer's steady step,
beside torch's Flight Recorder and TORCH_DISTRIBUTED_DEBUG=DETAIL.

    python -m bench.stallwatch --rounds 3 --steps 20
    python -m bench.stallwatch --rounds 1 --steps 6 --mesh 2x1x2 --settings off,watch
    python -m bench.stallwatch --micro

Each round runs the trainer once per setting, in turn (alternated, so a change of the shared
machine's load hits every setting alike), under ``torchrun --standalone --nproc-per-node
WORLD -m simcluster.train --model tiny --mesh MESH`` on this machine:

    off      --stall-s 0: Flight Recorder on (torch's default, 2000 entries), no watch, no p2p record
    watch    --stall-s 60 (the default): the p2p record, the watch thread, its store client
    no-fr    --stall-s 0 and TORCH_FR_BUFFER_SIZE=0: torch's Flight Recorder off too
    detail   --stall-s 0 and TORCH_DISTRIBUTED_DEBUG=DETAIL: torch's cross-rank fingerprint check
             of every collective (what names a shape or op mismatch before gloo sees it)

``--micro`` measures instead the watch's own work, in this process (a world-1 gloo group, Flight
Recorder filled with 2000 all_reduce entries): the time a recorded send/recv adds (its entry and its
caller's frame), the once-a-second progress read (Flight Recorder's status), and a full snapshot.

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

from simcluster.core.rundir import read_metrics

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


def micro(n: int = 20000) -> dict[str, float]:
    """Microseconds: a recorded call's entry, the watch's progress read, a snapshot (see the docstring)."""
    import time

    import torch
    import torch.distributed as dist

    from simcluster.train import commrecord, commstate

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(8)
    for _ in range(2000):
        dist.all_reduce(t)
    record = commrecord.Record(0)
    t0 = time.perf_counter()
    for _ in range(n):
        record.done(record.enter("send", t, 1, [0, 1]))
    enter = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(200):
        commstate.fr_status()
    status = (time.perf_counter() - t0) / 200 * 1e6
    t0 = time.perf_counter()
    for _ in range(5):
        record.snapshot()
    snap = (time.perf_counter() - t0) / 5 * 1e6
    dist.destroy_process_group()
    return {"recorded call (us)": enter, "progress read, once a second (us)": status, "snapshot at a stall (us)": snap}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stallwatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=3, help="steps left out at the start (default 3)")
    p.add_argument("--mesh", default="2x2x2")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    p.add_argument("--micro", action="store_true", help="the watch's own work per call and per second (in process)")
    a = p.parse_args(argv)
    if a.micro:
        for k, v in micro().items():
            print(f"{k:<36} {v:10.1f}")
        print(f"load average {os.getloadavg()[0]:.1f}")
        return 0
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
