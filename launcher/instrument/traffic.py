"""``--traffic 1`` for the user's code: the trainer's TrafficMode, active from torch's import on.

    python -m launcher up --mesh 2x2x2 --traffic 1 --script examples/manual_3d.py -- --steps 3
    cat runs/manual_3d-mesh-2x2x2/traffic/rank-0.jsonl

The one accounting is ``train/traffic.py`` (TrafficMode, summarize, TrafficLog); this module
only feeds it the rank layout and the step boundaries. Groups come from the layout of the job
(``layout.mesh_groups`` for a ``--mesh`` job; the world alone for ``--nodes``), nodes from
LOCAL_WORLD_SIZE. The mode is pushed on the main thread once torch is imported and stays
active: step k's record holds every communication issued after step k-1's boundary up to step
k's (what follows the last step is not written). Not seen: communication issued from threads the
user's code starts itself (dispatch modes are per thread), and inside compiled regions.
"""
from __future__ import annotations

import os

from simcluster.core.layout import mesh_groups


def groups_from_env(rank: int, env) -> dict[str, tuple[int, ...]]:
    """This rank's groups by dimension from the job's environment (SIMCLUSTER_PP/DP/TP, WORLD_SIZE)."""
    if all(k in env for k in ("SIMCLUSTER_PP", "SIMCLUSTER_DP", "SIMCLUSTER_TP")):
        return mesh_groups(rank, int(env["SIMCLUSTER_PP"]), int(env["SIMCLUSTER_DP"]), int(env["SIMCLUSTER_TP"]))
    return {"world": tuple(range(int(env.get("WORLD_SIZE", "1"))))}


class TrafficListener:
    """Pushes a TrafficMode now; at each step's end writes that step's summary for this rank.

    per_node: the ranks of a node (LOCAL_WORLD_SIZE); restart: the clock's restart count (a
    restarted job appends to its traffic files, a fresh one starts them anew)."""

    def __init__(self, out_dir: str, rank: int, per_node: int, restart: int, env=os.environ):
        from simcluster.train.traffic import TrafficLog, TrafficMode

        self.mode = TrafficMode(rank, per_node, groups_from_env(rank, env))
        self.log = TrafficLog(out_dir, rank, keep_until=1 if restart else 0)
        self.mode.__enter__()

    def begin(self, step: int) -> None:
        pass

    def end(self, step: int) -> None:
        from simcluster.train.traffic import summarize

        self.log.write(step, summarize(self.mode.take()))
