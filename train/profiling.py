"""Tracing chosen steps with ``torch.profiler``: one Chrome/Perfetto trace of every rank, each
rank's time breakdown, and the measured pipeline bubble.

    torchrun --standalone --nproc-per-node 4 -m train --mesh 2x1x2 --model tiny --steps 4 --trace-steps 3,4
    # open runs/mesh-2x1x2/trace.json in https://ui.perfetto.dev ; cat runs/mesh-2x1x2/profile/rank-0.json

Each rank profiles the steps of ``--trace-steps`` (``--profile-step N`` is the same as
``--trace-steps N``) and keeps the events that tell the pipeline's story, named by torch itself:
each microbatch's ``forward mbM sS`` / ``backward mbM sS`` (``backward-input`` and
``backward-weight`` for zero-bubble schedules; ``train.pipeline.TracedStage``), the runtime
schedules' ``PP:<stage><action><mb>``, ``gloo:*`` work (send/recv, collectives, on gloo's threads),
``FSDP::*``, ``_c10d_functional::*`` and ``Optimizer.*``; plus ``simcluster:step N``. Profiler
time stamps are moved to wall-clock microseconds (an anchor event is stamped with ``time.time``)
so the containers' traces line up. After the run, rank 0 merges RUN_DIR/trace/rank-R.json into
RUN_DIR/trace.json: one process per node (pid = node), one track per rank (tid = rank; gloo's
worker threads on a second track, tid = 1000 + rank).

Bubble: per traced step, the window from the first to the last pipeline compute event of any
rank; a rank's bubble is the part of the window its compute does not cover; the mean over ranks
is printed next to the textbook (p-1)/(m+p-1) of gpipe and 1f1b (p stages, m microbatches).
Breakdown categories are matched on event names: the wall time inside those calls, waiting
included; ``compute_and_other`` is the rest of the step.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from simcluster.core import timeline

CATEGORIES = {
    "pp_send_recv": ("gloo:send", "gloo:recv"),
    "tp_collectives": ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"),
    "fsdp_all_gather": ("FSDP::all_gather",),
    "fsdp_reduce_scatter": ("FSDP::post_backward_reduce",),
    "optimizer": ("Optimizer.step",),
}
KEEP = ("forward ", "backward", "PP:", "gloo:", "FSDP::", "_c10d_functional::", "Optimizer.", "simcluster:")
COMPUTE = re.compile(r"^(forward|backward|backward-input|backward-weight) mb\d+ s\d+$")
ANCHOR = "simcluster:anchor"


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


# the user's own code has no microbatch labels: keep its layers' ops and autograd's backward too
USER_KEEP = KEEP + ("c10d::", "aten::linear", "aten::_scaled_dot_product", "aten::matmul",
                    "autograd::engine::evaluate_function")


def kept_events(trace: dict, rank: int, node: int, step: int, keep: tuple[str, ...] = KEEP) -> list[dict]:
    """The pipeline-relevant complete ("X") events of one rank's exported trace, on wall-clock
    microseconds (shifted by the anchor's ``args.wall_us``), pid = node, tid = rank (main thread)
    or 1000 + rank (any other thread: gloo's workers)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    anchor = next((e for e in events if e.get("name") == ANCHOR), None)
    if anchor is None:
        return []
    shift = float(anchor["args"]["wall_us"]) - float(anchor["ts"])
    main_tid = anchor.get("tid")
    out = []
    for e in events:
        name = e.get("name", "")
        if not name.startswith(keep) or name == ANCHOR:
            continue
        out.append({"name": name, "ph": "X", "ts": round(float(e["ts"]) + shift, 3), "dur": float(e.get("dur", 0)),
                    "pid": node, "tid": rank if e.get("tid") == main_tid else 1000 + rank,
                    "cat": "compute" if COMPUTE.match(name) else "comm" if name.startswith(("gloo:", "_c10d", "FSDP::"))
                    else "other", "args": {"step": step, "rank": rank}})
    return out


class StepProfile:
    """torch.profiler around one step of one rank: ``start()``, the step, ``stop()``.

    ``stop`` writes RUN_DIR/trace/rank-R-step-S.json (the events ``keep`` names, on wall-clock
    microseconds) and returns ``prof.key_averages()`` for a breakdown. Used by the trainer
    (``maybe_profile``) and by the instruments of the user's code (launcher/instrument/trace.py).
    """

    def __init__(self, run_dir: str, rank: int, node: int, step: int, keep: tuple[str, ...] = KEEP):
        self.run_dir, self.rank, self.node, self.step, self.keep = run_dir, rank, node, step, keep
        os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # else kineto prints a USDT line at each start and stop
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._step_fn = None

    def start(self) -> None:
        self.prof.__enter__()
        before = time.time_ns()
        with torch.profiler.record_function(ANCHOR):
            self.wall_us = (before + time.time_ns()) / 2e3
        self._step_fn = torch.profiler.record_function(f"simcluster:step {self.step}")
        self._step_fn.__enter__()

    def stop(self):
        self._step_fn.__exit__(None, None, None)
        self.prof.__exit__(None, None, None)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        try:
            self.prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as fh:
                trace = json.load(fh)
        finally:
            os.remove(path)
        for e in trace.get("traceEvents", []):
            if e.get("name") == ANCHOR:
                e.setdefault("args", {})["wall_us"] = self.wall_us
        os.makedirs(os.path.join(self.run_dir, "trace"), exist_ok=True)
        out = os.path.join(self.run_dir, "trace", f"rank-{self.rank}-step-{self.step}.json")
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(kept_events(trace, self.rank, self.node, self.step, self.keep), fh)
        return self.prof.key_averages()


@contextmanager
def maybe_profile(enabled: bool, run_dir: str, rank: int, node: int, step: int, result: dict, first: bool = True):
    """Profile the enclosed step when enabled; writes RUN_DIR/trace/rank-R-step-S.json (kept events)
    and, for the first traced step, RUN_DIR/profile/rank-R.json (the breakdown, from
    ``result["step_time_s"]`` set by the caller inside the block)."""
    if not enabled:
        yield
        return
    prof = StepProfile(run_dir, rank, node, step)
    prof.start()
    try:
        yield
    finally:
        averages = prof.stop()
    os.makedirs(os.path.join(run_dir, "profile"), exist_ok=True)
    name = f"rank-{rank}.json" if first else f"rank-{rank}-step-{step}.json"
    with open(os.path.join(run_dir, "profile", name), "w", encoding="utf-8") as fh:
        json.dump(breakdown(averages, result["step_time_s"]), fh, indent=1, sort_keys=True)


def merge_traced_steps(run_dir: str, world_size: int, ranks_per_node: int, schedule: str, n_stages: int,
                       microbatches: int) -> None:
    """Collective, once every rank wrote its traced steps: rank 0 merges them into RUN_DIR/trace.json
    and prints each traced step's measured bubble beside the textbook (p-1)/(m+p-1)."""
    dist.barrier()
    if dist.get_rank() != 0:
        return
    path, events = timeline.merge(run_dir, world_size, ranks_per_node)
    book = timeline.textbook_bubble(schedule, n_stages, microbatches)
    for step, frac in timeline.bubble(events).items():
        ref = f"textbook (p-1)/(m+p-1) {book:.3f}" if book is not None else "no textbook value for this schedule"
        print(f"[simcluster] bubble step {step}: measured {frac:.3f}, {ref} ({schedule}, "
              f"p={n_stages}, m={microbatches})", flush=True)
    print(f"[simcluster] trace: {path}", flush=True)
