"""Whether a rank of the user's code communicated at all: its collectives and point-to-point calls counted.

    python -c "from simcluster.launcher.instrument.work import collectives; print(collectives())"

For the summary's NO WORK headline (launcher/observe/summary.py): a job whose ranks all exited 0
without a step and without a single collective trained nothing. Every process group numbers its
calls: ``ProcessGroup._get_sequence_number_for_group()`` grows by one per collective and per
send or recv, DTensor's functional collectives included (checked on torch 2.13 with gloo). A
rank's count is the sum over its process groups, read just before ``destroy_process_group``
removes them (the function is wrapped, in torch.distributed and its c10d module) and at the
rank's end (a multiprocessing finalizer: it runs at the end of a forked rank, which leaves
through os._exit after multiprocessing's exit function, and of a fresh interpreter alike). The
larger is written to RUN_DIR/steps/rank-R.work.json as ``{"collectives": N}``: 0 when the rank
never imported torch.distributed.
"""
from __future__ import annotations

import json
import os
import sys

from simcluster.launcher.instrument.lazy import when_imported
from simcluster.launcher.instrument.spec import STEPS_DIR, WORK_SUFFIX

_SEEN = [0]  # the largest count read so far


def collectives() -> int:
    """The calls of every live process group of this process, summed (0 without torch.distributed
    or a process group)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return 0
    try:
        groups = list(c10d._world.pg_map)
        return sum(int(g._get_sequence_number_for_group()) for g in groups)
    except Exception:  # noqa: BLE001 - a torch without these: nothing counted, nothing claimed
        return 0


def _count() -> int:
    _SEEN[0] = max(_SEEN[0], collectives())
    return _SEEN[0]


def _wrap(module) -> None:
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    inner = c10d.destroy_process_group
    if getattr(inner, "_simcluster_counted", False):
        return

    def destroy_process_group(*args, **kwargs):
        _count()
        return inner(*args, **kwargs)

    destroy_process_group.__doc__, destroy_process_group.__wrapped__ = inner.__doc__, inner
    destroy_process_group._simcluster_counted = True
    for home in (c10d, module):
        if getattr(home, "destroy_process_group", None) is inner:
            home.destroy_process_group = destroy_process_group


def install(out_dir: str, rank: int) -> None:
    """Count this rank's calls and write them at its end (see the module docstring)."""
    import multiprocessing.util

    path = os.path.join(out_dir, STEPS_DIR, f"rank-{rank}{WORK_SUFFIX}")
    pid = os.getpid()

    def write() -> None:
        if os.getpid() != pid:  # a child the rank forked (os.fork) ends: the rank's own count is not its
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"collectives": _count()}) + "\n")
        except OSError:
            pass

    multiprocessing.util.Finalize(None, write, exitpriority=100)
    when_imported("torch.distributed", _wrap)
