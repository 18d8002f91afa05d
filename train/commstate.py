"""What a rank's communication is doing now, read cheaply once a beat by the stall watch: torch's
Flight Recorder's per-group counters, this process's groups, whether the main thread compiles.

    python -c "from simcluster.train.commstate import fr_status, group_table; print(fr_status(), group_table())"

``fr_status`` reads Flight Recorder's ``pg_status`` only (no entries, no stacks; a few microseconds):
per group the last enqueued and last completed sequence numbers. A group with enqueued > completed
has its collective number completed + 1 under way on this rank: the stall watch publishes it as
``(group name, sequence number, group size)`` so that rank 0 can tell a collective every member of
its group is inside (slow, not hung: simcluster/core/hang.py ``under_way``) from one a member never
entered. Group names are Flight Recorder's (the same on every rank: groups are made collectively).
"""
from __future__ import annotations

import os

_SIZES: dict[str, int] = {}  # group name -> its size, this process's groups (filled on first need)


def _size(name: str) -> int:
    """The size of this process's group ``name`` (0: not known here)."""
    if name not in _SIZES:
        import torch.distributed.distributed_c10d as c10d

        for pg, pg_name in list(c10d._world.pg_names.items()):
            try:
                _SIZES[str(pg_name)] = int(pg.size())
            except Exception:  # noqa: BLE001 - a group being destroyed
                continue
    return _SIZES.get(name, 0)


def fr_status() -> tuple[int, list[tuple[str, int, int]]]:
    """(collectives completed, summed over this process's groups; the collectives under way: one
    ``(group name, sequence number, group size)`` per group with one enqueued and not completed, its
    oldest) from Flight Recorder's per-group counters; (0, []) when it is off or unreadable."""
    try:
        import pickle

        import torch._C._distributed_c10d as c10d

        status = pickle.loads(c10d._dump_fr_trace(includeCollectives=False, includeStackTraces=False)).get("pg_status", {})
        done = sum(int(s.get("last_completed_collective", 0)) for s in status.values())
        pending = [(str(name), int(s.get("last_completed_collective", 0)) + 1, _size(str(name)))
                   for name, s in sorted(status.items())
                   if int(s.get("last_enqueued_collective", 0)) > int(s.get("last_completed_collective", 0))]
        return done, pending
    except Exception:  # noqa: BLE001
        return 0, []


def group_table() -> dict[str, list[int]]:
    """Each process group's name (Flight Recorder's) -> its global ranks."""
    try:
        import torch.distributed.distributed_c10d as c10d

        return {str(name): sorted(c10d._world.pg_group_ranks.get(pg, {}).keys()) or list(range(c10d.get_world_size()))
                for pg, name in c10d._world.pg_names.items()}
    except Exception:  # noqa: BLE001
        return {}


COMPILING = (os.sep + os.path.join("_dynamo", "convert_frame.py"), os.sep + os.path.join("_inductor", "compile_fx.py"))


def compiling(frame) -> bool:
    """Whether a thread whose innermost frame is ``frame`` is inside a torch.compile: a frame of
    dynamo's frame conversion or inductor's compile_fx (a compiled graph running has neither)."""
    while frame is not None:
        if frame.f_code.co_filename.endswith(COMPILING):
            return True
        frame = frame.f_back
    return False
