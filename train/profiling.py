"""Where a step's time goes, per rank, from one ``torch.profiler`` step.

    torchrun --standalone --nproc-per-node 8 -m train --mesh 2x2x2 --model small --steps 4 --profile-step 3
    cat runs/local/profile/rank-0.json

Categories are matched on the profiler's event names (torch 2.13 CPU/gloo): each is the wall time
this rank spent inside those calls, waiting included; ``compute_and_other`` is the rest of the step.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager

import torch

CATEGORIES = {
    "pp_send_recv": ("gloo:send", "gloo:recv"),
    "tp_collectives": ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"),
    "fsdp_all_gather": ("FSDP::all_gather",),
    "fsdp_reduce_scatter": ("FSDP::post_backward_reduce",),
    "optimizer": ("Optimizer.step",),
}


def breakdown(events, step_time_s: float) -> dict[str, float]:
    """Seconds per category from ``prof.key_averages()``; adds ``compute_and_other`` and ``step``."""
    out = {k: 0.0 for k in CATEGORIES}
    for ev in events:
        for cat, prefixes in CATEGORIES.items():
            if ev.key.startswith(prefixes) and "_copy_out" not in ev.key:
                out[cat] += ev.cpu_time_total / 1e6
    out["compute_and_other"] = max(0.0, step_time_s - sum(out.values()))
    out["step"] = step_time_s
    return out


@contextmanager
def maybe_profile(enabled: bool, run_dir: str, rank: int, result: dict):
    """Profile the enclosed step when enabled; writes RUN_DIR/profile/rank-R.json from
    ``result["step_time_s"]`` (set by the caller inside the block)."""
    if not enabled:
        yield
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield
    os.makedirs(os.path.join(run_dir, "profile"), exist_ok=True)
    with open(os.path.join(run_dir, "profile", f"rank-{rank}.json"), "w") as fh:
        json.dump(breakdown(prof.key_averages(), result["step_time_s"]), fh, indent=1, sort_keys=True)
