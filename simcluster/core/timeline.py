"""The merged pipeline timeline of traced steps and its measured bubble. Torch-free.

    python -c "from simcluster.core.timeline import merge; print(merge('runs/mesh-2x1x2', 4, 2))"

``merge`` joins the per-rank files ``train.profiling`` wrote (RUN_DIR/trace/rank-R-step-S.json,
wall-clock microseconds) into RUN_DIR/trace.json, a Chrome trace-event file that Perfetto and
chrome://tracing open: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``, complete events
(ph "X", ts/dur in microseconds) plus metadata events naming each process "node-K" and each
track "rank R" (and "rank R gloo" for gloo's worker threads).
"""
from __future__ import annotations

import glob
import json
import os

from simcluster.core.layout import node_name, node_of

COMPUTE_CAT = "compute"


def textbook_bubble(schedule: str, stages: int, microbatches: int) -> float | None:
    """(p-1)/(m+p-1) for gpipe and 1f1b (p stages, m microbatches); None for other schedules."""
    if schedule not in ("gpipe", "1f1b"):
        return None
    return (stages - 1) / (microbatches + stages - 1)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def bubble(events: list[dict]) -> dict[int, float]:
    """Measured bubble fraction per traced step: mean over ranks of the share of the step's
    pipeline window (first to last compute event of any rank) that the rank's compute events do
    not cover. events: merged trace events (cat "compute" counted; args.step, tid = rank)."""
    by_step: dict[int, dict[int, list]] = {}
    for e in events:
        if e.get("cat") == COMPUTE_CAT and e.get("ph") == "X":
            by_step.setdefault(e["args"]["step"], {}).setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    out = {}
    for step, ranks in sorted(by_step.items()):
        lo = min(a for iv in ranks.values() for a, _ in iv)
        hi = max(b for iv in ranks.values() for _, b in iv)
        if hi > lo:
            out[step] = sum(1 - _union(iv) / (hi - lo) for iv in ranks.values()) / len(ranks)
    return out


def merge(run_dir: str, world_size: int, ranks_per_node: int) -> tuple[str, list[dict]]:
    """Write RUN_DIR/trace.json from every RUN_DIR/trace/rank-R-step-S.json; returns (path, events).

    Raises:
        FileNotFoundError: no per-rank trace file in RUN_DIR/trace.
    """
    files = sorted(glob.glob(os.path.join(run_dir, "trace", "rank-*-step-*.json")))
    if not files:
        raise FileNotFoundError(f"no traced step in {run_dir}/trace; run with --trace-steps 3,4")
    events: list[dict] = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            events.extend(json.load(fh))
    meta = []
    nnodes = world_size // ranks_per_node
    for node in range(nnodes):
        meta.append({"ph": "M", "name": "process_name", "pid": node, "tid": 0, "args": {"name": node_name(node, nnodes)}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": node, "tid": 0, "args": {"sort_index": node}})
    for rank in range(world_size):
        node = node_of(rank, ranks_per_node)
        for tid, label, order in ((rank, f"rank {rank}", 2 * rank), (1000 + rank, f"rank {rank} gloo", 2 * rank + 1)):
            meta.append({"ph": "M", "name": "thread_name", "pid": node, "tid": tid, "args": {"name": label}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": node, "tid": tid, "args": {"sort_index": order}})
    events.sort(key=lambda e: (e["ts"], -e["dur"]))
    path = os.path.join(run_dir, "trace.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, fh)
    os.replace(path + ".tmp", path)
    return path, events


def merge_found(run_dir: str) -> tuple[str, list[dict]] | None:
    """``merge`` with the world size and node count read from the per-rank files themselves (the
    highest rank + 1; the nodes are the events' pids): for a folder whose job the caller does not
    know, such as the user's code started with plain ``docker compose up``. None without files."""
    ranks, nodes = set(), set()
    for f in glob.glob(os.path.join(run_dir, "trace", "rank-*-step-*.json")):
        ranks.add(int(os.path.basename(f).split("-")[1]))
        with open(f, encoding="utf-8") as fh:
            nodes.update(e.get("pid", 0) for e in json.load(fh)[:1])
    if not ranks:
        return None
    world = max(ranks) + 1
    return merge(run_dir, world, world // max(1, len(nodes)))


def ranks_in(events: list[dict]) -> set[int]:
    """Ranks with at least one event on their main track."""
    return {e["tid"] for e in events if e.get("ph") == "X" and e["tid"] < 1000}


