"""What a rank holds at each milestone of its start: PSS, USS, threads, sockets, the heaps.

    python -c "from simcluster.train import memprobe; memprobe.on('/tmp/mp'); print(open('/tmp/mp/memory/rank-0.jsonl').read())"

Off unless the run asks for it (``--memory-probe 1``: ``on(run_dir)``, before the process
group). Then ``mark(name)`` appends one line to RUN_DIR/memory/rank-R.jsonl: the milestone's name, the
time, and this process's memory as /proc/self/smaps_rollup gives it (``pss_kb``, ``uss_kb`` =
Private_Clean + Private_Dirty, ``rss_kb``, ``anon_kb``), as bench/memory.py's /proc walk reads the
machine's; ``threads`` (/proc/self/task), ``sockets`` (open socket descriptors: a gloo pair is one),
glibc's heap (mallinfo2: ``malloc_held_kb`` its arenas and mmap'd blocks, ``malloc_used_kb``
what is allocated from them) and ``py_blocks`` (the objects Python's allocator holds). The
difference between two milestones is what that part of the start added: the process group
(its pairs, buffers and threads), the DeviceMesh's groups, the model and optimizer, the first
step. Off, ``mark`` returns at once and reads nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
import time

_PATH: list[str] = []  # the file marks go to, once on() ran


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def on(run_dir: str, enabled: int = 1, rank: int | None = None) -> None:
    """When ``enabled``: record this process's marks into RUN_DIR/memory/rank-R.jsonl (R: ``rank``,
    else $RANK, else 0), the first ("start") now."""
    if not enabled:
        return
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    folder = os.path.join(run_dir, "memory")
    os.makedirs(folder, exist_ok=True)
    _PATH[:] = [os.path.join(folder, f"rank-{rank}.jsonl")]
    mark("start")


def _malloc_kb() -> tuple[int, int] | None:
    """(held, used) kB of glibc's heap over every arena, None where libc has no mallinfo2."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    return (m.arena + m.hblkhd) // 1024, (m.uordblks + m.hblkhd) // 1024


def snapshot() -> dict:
    """This process's memory now (the fields of a mark, without its name)."""
    with open("/proc/self/smaps_rollup") as fh:
        kb = {k.strip(): int(v.split()[0]) for k, v in (line.split(":", 1) for line in fh) if v.strip().endswith("kB")}
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    rec = {"pss_kb": kb["Pss"], "uss_kb": kb["Private_Clean"] + kb["Private_Dirty"], "rss_kb": kb["Rss"],
           "anon_kb": kb.get("Anonymous", 0), "threads": len(os.listdir("/proc/self/task")), "sockets": sockets,
           "py_blocks": sys.getallocatedblocks()}
    if (heap := _malloc_kb()) is not None:
        rec["malloc_held_kb"], rec["malloc_used_kb"] = heap
    return rec


def mark(name: str) -> None:
    """Append milestone ``name`` with this process's memory now; nothing when off."""
    if not _PATH:
        return
    with open(_PATH[0], "a") as fh:
        fh.write(json.dumps({"mark": name, "t": time.time(), **snapshot()}) + "\n")
