"""What the rehearsal's Flight Recorder dump adds to a stall, and what `launcher diagnose` takes to read it.

    python -m bench.flightrec --entries 2000

In this process (a world-1 gloo group, ``--entries`` all_reduce calls in torch's Flight Recorder,
each with its Python stack): the first ``write_dump`` (train/flightrec.py, what each rank's stall
watch does at a stall when TORCH_NCCL_DEBUG_INFO_TEMP_FILE names a prefix), the stall watch's
record snapshot after it (train/commrecord.py), a snapshot with no dump before it (in a fresh
process: torch caches symbolized stacks), the dump file's size, and ``diagnose_folder`` on it.
CPU seconds of this process beside wall seconds, and the load average.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

CHILD = "SIMCLUSTER_BENCH_FR_CHILD"


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def measure(entries: int, dump: bool) -> dict[str, float]:
    """Seconds (CPU, wall) of the first dump (when ``dump``) and of the snapshot after it; the file's bytes."""
    import torch
    import torch.distributed as dist

    from simcluster.train import commrecord, commstate
    from simcluster.train.flightrec import diagnose_folder, write_dump

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29562")
    dist.init_process_group("gloo", rank=0, world_size=1)
    record = commrecord.install(0)
    t = torch.ones(8)
    for _ in range(entries):
        dist.all_reduce(t)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{tmp}/nccl_trace_rank_"} if dump else {}
        c0, w0 = _clock()
        path = write_dump(0, commstate.group_table(), env)
        c1, w1 = _clock()
        record.snapshot()
        c2, w2 = _clock()
        if path:
            out.update({"dump CPU s": c1 - c0, "dump wall s": w1 - w0, "dump bytes": os.path.getsize(path)})
            diagnose_folder(tmp)
            out["diagnose wall s"] = _clock()[1] - w2
        out.update({"snapshot CPU s": c2 - c1, "snapshot wall s": w2 - w1})
    dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flightrec", description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=2000, help="all_reduce calls recorded first (default 2000)")
    a = p.parse_args(argv)
    if os.environ.get(CHILD):
        for k, v in measure(a.entries, os.environ[CHILD] == "dump").items():
            print(f"{k:<20} {v:12.3f}")
        return 0
    for mode in ("dump", "snapshot only"):
        print(f"-- {mode} ({a.entries} entries)", flush=True)
        subprocess.run([sys.executable, "-m", "bench.flightrec", "--entries", str(a.entries)], check=True,
                       env={**os.environ, CHILD: "dump" if mode == "dump" else "none", "OMP_NUM_THREADS": "1"})
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
