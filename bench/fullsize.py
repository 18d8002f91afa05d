"""The full-size plan against torchtitan's published Llama 3.1 8B runs on H100s: predicted peak
reserved memory and tokens/s a GPU, the plan's own wall time here, and the one fitted constant.

    python -m bench.fullsize --python /work/venv-fullsize/bin/python [--rows 8b-fsdp8,8b-fsdp128] [--assets DIR]

Needs torchtitan 0.2.2 importable by --python (examples/frameworks/torchtitan/requirements.txt in
a virtual environment: ``python -m venv --system-site-packages V && V/bin/pip install torch==2.13.0
-r examples/frameworks/torchtitan/requirements.txt``). The tokenizer of the real vocabulary size
and the data are made locally once (prepare.py --vocab 128256, about 2 minutes) into --assets.

Rows (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Grand Teton H100 96 GB at 500 W,
torchtitan's launcher set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True):
- 8b-fsdp8: Table 1 row 1, FSDP over 8 GPUs, local batch 2, seq 8192, selective (op) AC: 5,762
  tokens/s a GPU, 82.4 GiB. The only row any constant is set from: MATMUL_EFFICIENCY is solved here
  (bisection) so that this row's predicted tokens/s is the published one.
- 8b-fsdp128: Table 3 row 1, the same on 128 GPUs (16 hosts): 5,605 tokens/s, 67.0 GiB (held back).
The other rows of that page (torch.compile, Float8, AsyncTP, CP with full AC, 70B and 405B with
compile + Float8) and its H200 page (compile + Float8) are left out: the plan runs no compiled graph
or Float8 kernels (see BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PUBLISHED = {"8b-fsdp8": (1, 8, 5762, 82.4), "8b-fsdp128": (16, 8, 5605, 67.0)}  # nodes, per node, tok/s, GiB
TITAN = ["--model.name", "llama3", "--model.flavor", "8B", "--model.hf-assets-path", "assets/tokenizer",
         "--training.dataset", "c4_test", "--training.dataset-path", "data/shakespeare",
         "--training.local-batch-size", "2", "--training.seq-len", "8192", "--training.steps", "2",
         "--activation-checkpoint.mode", "selective", "--activation-checkpoint.selective-ac-option", "op",
         "--metrics.log-freq", "1", "--job.dump-folder", "/tmp/simcluster-fullsize-titan"]


def prepare(assets: str) -> None:
    """The tokenizer (vocabulary 128256) and data under assets, made once."""
    if not os.path.exists(os.path.join(assets, "assets", "tokenizer", "tokenizer.json")):
        subprocess.run([sys.executable, "examples/frameworks/torchtitan/prepare.py", "/work/shared/data/tinyshakespeare.txt",
                        assets, "--vocab", "128256"], check=True)


def plan(row: str, python: str, assets: str, traces: str) -> tuple[dict, float]:
    """The plan's JSON for one row and its wall seconds."""
    nodes, per, _, _ = PUBLISHED[row]
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", "--module", "torchtitan.train", "--code", assets,
           "--nodes", str(nodes), "--nproc-per-node", str(per), "--gpu", "h100-96g", "--python", python,
           "--env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "--ranks", "0", "--trace-dir", traces,
           "--json", "--", *TITAN, "--parallelism.data-parallel-shard-degree", str(nodes * per)]
    start = time.monotonic()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out), time.monotonic() - start


def fit(trace_path: str, target_tps: float) -> float:
    """The matmul efficiency at which the trace's predicted tokens/s is target_tps (bisection)."""
    from simcluster.train.plan.fullsize.device import constants
    from simcluster.train.plan.fullsize.speed import speed
    from simcluster.train.plan.fullsize.trace import read

    trace, device = read(trace_path), constants("h100-96g")
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if speed(trace, device, mid).tokens_per_s < target_tps:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="an interpreter with torchtitan 0.2.2")
    ap.add_argument("--rows", default=",".join(PUBLISHED), help=f"comma-separated, of {', '.join(PUBLISHED)}")
    ap.add_argument("--assets", default="/tmp/simcluster-fullsize-assets", help="tokenizer and data (made once)")
    a = ap.parse_args()
    prepare(a.assets)
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    for row in a.rows.split(","):
        traces = os.path.join(a.assets, "traces", row)
        data, wall = plan(row, a.python, a.assets, traces)
        r = data["ranks"][0]
        _, _, tps, gib = PUBLISHED[row]
        print(f"{row}: reserved {r['peak_reserved_gib']:.1f} GiB (published {gib}, {r['peak_reserved_gib'] / gib - 1:+.1%}), "
              f"allocated {r['peak_allocated_gib']:.1f} GiB, {r['tokens_per_s']:,.0f} tokens/s a GPU (published "
              f"{tps:,}, {r['tokens_per_s'] / tps - 1:+.1%}), step {r['step_s']:.3f} s, MFU {r['mfu']:.1%}, "
              f"{'fits' if r['fits'] else 'OOM'}; plan {wall:.0f} s here (rank run {r['seconds_here']:.0f} s), "
              f"load {os.getloadavg()[0]:.1f}")
        if row == "8b-fsdp8":
            print(f"  fitted MATMUL_EFFICIENCY on this row: {fit(os.path.join(traces, 'trace-0.json'), tps):.4f}")


if __name__ == "__main__":
    main()
