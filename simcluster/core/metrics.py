"""Per-step metrics: one JSON object per line in RUN_DIR/metrics.jsonl and one log line per step.

    python -c "import json; [print(json.loads(l)['loss']) for l in open('runs/mesh-1x1x1/metrics.jsonl')]"

The metrics.jsonl schema, shared by the built-in trainer and any script on the cluster (the
launcher shows progress from it when a job writes it into $SIMCLUSTER_OUTPUT_DIR): one JSON
object per line, one line per optimizer step, in step order.
    step          int, required: the step just finished, 1-based
    total_steps   int: steps of the whole run (for progress and ETA)
    loss          float: the global-batch training loss of the step
    tokens_per_s  float: tokens (or samples) per second of the step, all ranks together
    step_time_s   float: seconds of the step
    val_loss      float: the validation loss, on the steps that validate
    lr, grad_norm float; rss_mb: list of float, peak RSS (MB) of each rank
    traffic       (``--traffic 1``) the step's communication summed over all ranks:
                  {"bytes": {kind: int}, "messages": {kind: int}, "links": {"i->j" | "span": bytes}},
                  kinds pp_send, pp_recv, tp_all_reduce, fsdp_all_gather, fsdp_reduce_scatter,
                  world_all_reduce, other (see train/traffic.py)
Other keys are allowed and ignored by the launcher.
"""
from __future__ import annotations

import json
import os
import resource

from simcluster.core.rundir import METRICS, read_metrics


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step_line(rec: dict, steps: int) -> str:
    """The concise per-step log line (the launcher parses it; keep the field order)."""
    line = (f"step {rec['step']}/{steps} loss {rec['loss']:.4f} grad_norm {rec['grad_norm']:.4f} "
            f"lr {rec['lr']:.2e} step_time {rec['step_time_s']:.3f}s tokens_per_s {rec['tokens_per_s']:.0f} "
            f"rss_mb {max(rec['rss_mb']):.0f}")
    if rec.get("val_loss") is not None:
        line += f" val_loss {rec['val_loss']:.4f}"
    return line


class MetricsWriter:
    """Appends step records to ``RUN_DIR/metrics.jsonl``; a no-op where ``run_dir`` is None.

    A resumed run keeps the records of steps <= ``keep_until`` (the checkpoint's step) and drops
    later ones, so the file holds each step exactly once however often the run restarts.
    """

    def __init__(self, run_dir: str | None, name: str = METRICS, keep_until: int = 0):
        self.path = os.path.join(run_dir, name) if run_dir else None
        if self.path:
            os.makedirs(run_dir, exist_ok=True)
            kept = [r for r in read_metrics(run_dir, name) if r["step"] <= keep_until] \
                if keep_until and os.path.exists(self.path) else []
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept)
            os.replace(tmp, self.path)

    def write(self, rec: dict) -> None:
        if self.path:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f} MB"


def host_links(totals: dict, hosts: list[str]) -> dict[str, int]:
    """One step's node links (``"i->j"`` bytes, sent from node i to node j) summed per host pair:
    ``{"host-0->host-1": bytes, ...}`` for every ordered pair of distinct hosts, hosts[i] being node i's
    host (rehearsal hosts, ``up --hosts``). Collectives spanning nodes (``span``) name no link and are
    not counted."""
    out = {f"{a}->{b}": 0 for a in dict.fromkeys(hosts) for b in dict.fromkeys(hosts) if a != b}
    for link, v in totals.get("links", {}).items():
        if "->" in link:
            i, j = (int(x) for x in link.split("->"))
            if i < len(hosts) and j < len(hosts) and hosts[i] != hosts[j]:
                out[f"{hosts[i]}->{hosts[j]}"] += v
    return out


def traffic_text(totals: dict, hosts: list[str] | None = None) -> str:
    """One step's world traffic totals (the ``traffic`` key) in one line, e.g.
    ``pp_send 1.05 MB (8 msgs), tp_all_reduce 16.78 MB (128 msgs); inter-node 1.05 MB``; inter-node
    counts the p2p bytes sent from one node to another. hosts (node i's host, ``up --hosts``) adds
    ``; inter-host 1.05 MB (host-0->host-1 1.05 MB, host-1->host-0 0.00 MB)`` (host_links)."""
    parts = [f"{k} {_mb(v)} ({totals.get('messages', {}).get(k, 0)} msgs)"
             for k, v in totals.get("bytes", {}).items() if v]
    inter = sum(v for link, v in totals.get("links", {}).items()
                if "->" in link and link.split("->")[0] != link.split("->")[1])
    text = ", ".join(parts) + f"; inter-node {_mb(inter)}"
    if hosts:
        pairs = host_links(totals, hosts)
        text += (f"; inter-host {_mb(sum(pairs.values()))} ("
                 + ", ".join(f"{pair} {_mb(v)}" for pair, v in pairs.items()) + ")")
    return text
