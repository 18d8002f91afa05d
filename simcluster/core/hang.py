"""The hang contract: what host code reads of the stall watch (train/stallwatch.py, the torch side): the
file names it writes in a run folder, the exit status of a hang, --stall-s's default and the limit in force,
and hang.json read back. Stdlib only (the floor: no torch, nothing of train/ or launcher/).

    python -c "from simcluster.core.hang import read_hang, stall_limit; print(read_hang('runs/mesh-2x2x2'), stall_limit(None, 600))"

hang.json's fields and the diagnosis's words are docs/faults.md's; the diagnosis itself is
simcluster/core/hang_diagnosis.py (pure).
"""
from __future__ import annotations

import os

from simcluster.core.rundir import read_json_since

STALL_DEFAULT_S = 60.0  # --stall-s's default (the trainer's Config and the instruments' environment)
EXIT_HANG = 4  # a rank's exit status, and `launcher up`'s, after a stall (docs/faults.md)
HANG_FILE = "hang.json"
STACKS_DIR = "stacks"


def stall_limit(stall_s: float | None, timeout_s: float) -> float:
    """The stall limit in force (s; 0: off): --stall-s when given, else STALL_DEFAULT_S when the
    job's timeout is at least that long (a shorter timeout ends a hang before the watch could)."""
    if stall_s is not None:
        return float(stall_s)
    return STALL_DEFAULT_S if timeout_s >= STALL_DEFAULT_S else 0.0


def read_hang(run_dir: str, since: float = 0.0) -> dict | None:
    """RUN_DIR/hang.json when this run wrote it (modified at or after ``since``, UNIX time), else
    None: {"diagnosis": [lines], "stall_s", "idle_s", "world_size", "missing", "records"}."""
    doc = read_json_since(os.path.join(run_dir, HANG_FILE), since)
    return doc if isinstance(doc, dict) and isinstance(doc.get("diagnosis"), list) else None
