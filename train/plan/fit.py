"""Does each node's predicted memory fit its limit? The planner's side of the launcher's preflight.

    python -m launcher up --mesh 2x2x2 --model small --memory-per-node 200m                  # a warning per node
    python -m launcher up --mesh 2x2x2 --model small --memory-per-node 200m --strict-memory  # refused, exit 2

A node (a pp stage's container on Compose, launcher/container/layout.py) holds the ranks
``node * ranks_per_node .. + ranks_per_node - 1``; its predicted bytes are the sum of its ranks'
``RankPlan.total`` (parameters, gradients, optimizer state, FSDP's gathered parameters, peak
activations; predict.py). That is tensors only: each rank's process adds the interpreter and
torch's libraries (a few hundred MB, measured in BENCHMARKS.md), which the message says.
"""
from __future__ import annotations

from simcluster.core.layout import node_name, node_of
from simcluster.core.config import TrainRun
from simcluster.train.plan.predict import Plan, plan


def node_bytes(p: Plan) -> dict[int, int]:
    """Node index -> the predicted bytes of its ranks' tensors at their peaks (each rank's peak summed)."""
    out: dict[int, int] = {}
    for r in p.ranks:
        node = node_of(r.rank, p.run.mesh.ranks_per_node)
        out[node] = out.get(node, 0) + r.total
    return out


def over_memory(run: TrainRun, limit: int, flag: str) -> list[str]:
    """One line per node whose predicted tensors exceed ``limit`` bytes (flag: how the user set it,
    e.g. ``--memory-per-node 3g``), naming the node, both sizes and the fixes; empty when all fit."""
    lines = []
    for node, nbytes in sorted(node_bytes(plan(run)).items()):
        if nbytes > limit:
            lines.append(f"{node_name(node, run.mesh.pp)}: its {run.mesh.ranks_per_node} ranks' tensors are predicted at "
                         f"{nbytes / 2**20:.0f} MiB > {flag} ({limit / 2**20:.0f} MiB), before each process's own "
                         f"runtime; raise {flag.split()[0]}, or spread the model wider (more pp or dp), or "
                         f"shorten --seq-len / --global-batch (python -m launcher plan shows each rank's share)")
    return lines
