"""Every rank's record of its communication: torch's Flight Recorder for the collectives, this
module for the point-to-point calls Flight Recorder leaves out on gloo.

    python -c "from simcluster.train.commrecord import Record; print(Record(rank=0).snapshot())"

What torch 2.13's Flight Recorder (``torch/csrc/distributed/c10d/FlightRecorder.hpp``) keeps for
gloo, on by default (``TORCH_FR_BUFFER_SIZE``, default 2000 entries; 0 turns it off): one entry per
collective that ProcessGroupGloo enqueues, including those of DTensor's and FSDP2's functional
collectives: the group's name, ``collective_seq_id`` (its sequence number in that group),
``profiling_name`` (``gloo:all_reduce``), input and output sizes and dtypes, the Python stack
at the call (``frames``, innermost first) and ``retired`` once the work has finished. It does not
keep, on gloo: send, recv, isend, irecv and batch_isend_irecv (no entry at all), the states
``started``/``completed`` (an entry stays ``scheduled``; ``retired`` is its completion) and the
group's ranks (``pg_config`` lists the default group only, with ranks ``[]``).
``torch._C._distributed_c10d._dump_fr_trace`` reads it in process.

So this record adds: every point-to-point call (op, peer, group, its sequence number per
(op, peer), shapes, dtype, caller file:line, entered/completed; ``install`` wraps
``torch.distributed``'s send, recv, isend and irecv, which batch_isend_irecv and torch's
pipelining call), the ranks of each group (torch's own group table) and each collective's caller
(the first frame of Flight Recorder's stack outside torch and the standard library).
``Record.snapshot`` joins both into one JSON-able dict (docs/faults.md names its fields).
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

from simcluster.train import commstate

KEEP = 24  # entries kept per group (collectives) and in all (p2p) in a snapshot: the hang is at the end
_TORCH_DIR: str | None = None
_STDLIB = os.path.dirname(os.__file__)
_OWN = {os.path.abspath(__file__)}
# folders whose frames sit between your line and torch, named by whoever installs them there: the launcher's
# instruments in a rank of your code (the simulated GPU's wrappers among them) call skip_frames_under
_SKIPPED: list[str] = []


def skip_frames_under(folder: str) -> None:
    """Frames of the files under ``folder`` are not the caller to name (idempotent). The launcher's
    instruments (launcher/instrument/rank.py) name their own folder this way before the watch starts:
    train/ imports nothing of launcher/ and spells none of its paths."""
    prefix = os.path.join(os.path.abspath(folder), "")
    if prefix not in _SKIPPED:
        _SKIPPED.append(prefix)


def _torch_dir() -> str:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    return _TORCH_DIR


def foreign(path: str) -> bool:
    """A frame of torch, the standard library, this record or a folder skip_frames_under named: not the caller to name."""
    if not path or path.startswith("<") or path in _OWN or path.startswith(tuple(_SKIPPED)):
        return True
    if path.startswith(_torch_dir()):
        return True
    return path.startswith(_STDLIB) and "-packages" not in path


def short(path: str) -> str:
    """A caller's file as a person names it: relative to the working directory when inside it,
    the part after ``simcluster/`` for this project's trainer, else the file name."""
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    if "/simcluster/" in path:
        return path.split("/simcluster/", 1)[1]
    return os.path.basename(path)


def caller(frame=None) -> str:
    """``file:line`` of the innermost frame outside torch, the standard library and this module."""
    f = frame or sys._getframe(1)
    while f is not None:
        if not foreign(f.f_code.co_filename):
            return f"{short(f.f_code.co_filename)}:{f.f_lineno}"
        f = f.f_back
    return "?"


def frame_text(frame) -> str:
    """``file:line (function)`` of the innermost frame outside torch and the standard library,
    else of ``frame`` itself."""
    f = frame
    while f is not None:
        if not foreign(f.f_code.co_filename):
            return f"{short(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return f"{short(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})" if frame else "?"


class Record:
    """One rank's point-to-point calls and its view of Flight Recorder.

    rank: this rank (global). p2p: the last calls, each a dict {"op": "send"|"recv", "peer": global
    rank or None (any source), "group": the group's ranks, "seq": n-th call of this op to this
    peer (1-based), "shapes", "dtype", "where": file:line, "state": "entered"|"completed"}.
    completed: how many calls completed (the stall clock's progress); open: how many were entered and
    have not completed (the rank waits in communication while one is open).
    """

    def __init__(self, rank: int):
        self.rank = rank
        self.p2p: collections.deque = collections.deque(maxlen=KEEP * 4)
        self.pending: list = []  # (entry, work) of isend/irecv not seen completed
        self.completed = self.open = 0
        self.seq: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def enter(self, op: str, tensor, peer, group_ranks: list[int]) -> dict:
        """Record a call entered; returns its entry."""
        with self.lock:
            self.seq[(op, peer)] += 1
            entry = {"op": op, "peer": peer, "group": group_ranks, "seq": self.seq[(op, peer)],
                     "shapes": [list(tensor.shape)], "dtype": str(tensor.dtype).removeprefix("torch."),
                     "where": caller(sys._getframe(2)), "state": "entered", "t": round(time.time(), 3)}
            self.p2p.append(entry)
            self.open += 1
        return entry

    def done(self, entry: dict) -> None:
        entry["state"] = "completed"
        self.completed += 1
        self.open -= 1

    def failed(self, entry: dict | None) -> None:
        """A call that raised: no longer open, not completed (None: a call the record missed)."""
        if entry is not None:
            entry["state"] = "failed"
            self.open -= 1

    def poll(self) -> int:
        """Mark the isend/irecv works that finished; returns ``completed``."""
        with self.lock:
            left = []
            for entry, work in self.pending:
                try:
                    finished = work.is_completed()
                except Exception:  # noqa: BLE001 - a failed work is over too
                    finished = True
                if finished:
                    self.done(entry)
                else:
                    left.append((entry, work))
            self.pending = left
        return self.completed

    def snapshot(self) -> dict:
        """This rank's record: {"rank", "groups": {name: ranks}, "collectives": [...], "p2p": [...]}
        (collectives: the last KEEP of each group from Flight Recorder, each {"group", "seq", "op",
        "shapes", "dtypes", "where", "state"})."""
        self.poll()
        groups = commstate.group_table()
        colls = collectives(flight_recorder(), groups)
        with self.lock:
            p2p = [dict(x) for x in self.p2p][-KEEP:]
        return {"rank": self.rank, "groups": {k: v for k, v in groups.items()},
                "collectives": colls, "p2p": p2p}


def collectives(entries: list[dict], groups: dict[str, list[int]], is_foreign=None, keep: int = KEEP) -> list[dict]:
    """Flight Recorder's entries (torch's dump format: ``process_group``, ``collective_seq_id``,
    ``profiling_name``, sizes, dtypes, ``frames`` innermost first, ``retired``) as the record's
    collectives, the last ``keep`` of each group: {"group": its global ranks (``groups`` by the
    group's name), "seq", "op", "shapes", "dtypes", "where": the first frame not ``is_foreign``
    (default ``foreign``) as file:line, "state": "completed" | "entered", "t": seconds}.
    The stall watch's snapshot and ``launcher diagnose`` (train/flightrec.py) both read entries
    through this function."""
    is_foreign = is_foreign or foreign
    colls: dict[str, list] = {}
    for e in entries:
        name = str(e.get("process_group", ("?",))[0])
        frames = e.get("frames") or []
        where = next((f"{short(f['filename'])}:{f['line']}" for f in frames if not is_foreign(f.get("filename", ""))),
                     "?")
        colls.setdefault(name, []).append({
            "group": groups.get(name), "seq": e.get("collective_seq_id"),
            "op": str(e.get("profiling_name", "")).split(":")[-1],
            "shapes": e.get("input_sizes"), "dtypes": [str(d).lower() for d in e.get("input_dtypes") or []],
            "where": where, "state": "completed" if e.get("retired") else "entered",
            "t": round((e.get("time_created_ns") or 0) / 1e9, 3)})
    return [x for v in colls.values() for x in v[-keep:]]


def flight_recorder(stacks: bool = True) -> list[dict]:
    """Flight Recorder's entries of this process (empty when it is off or unreadable)."""
    try:
        import pickle

        import torch._C._distributed_c10d as c10d

        return pickle.loads(c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=stacks,
                                                onlyActive=False)).get("entries", [])
    except Exception:  # noqa: BLE001
        return []


def _peer_and_group(known: dict, peer, group, group_peer) -> tuple:
    """(the global peer, the group's global ranks) of a point-to-point call; known caches each group's ranks."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    g = group if group is not None else c10d._get_default_group()
    ranks = known.get(g)
    if ranks is None:
        ranks = known[g] = commstate.group_table().get(c10d._world.pg_names.get(g, ""), [])
    if peer is None and group_peer is not None:
        peer = dist.get_global_rank(g, group_peer)
    return peer, ranks


RECORD: Record | None = None


def install(rank: int) -> Record:
    """Wrap torch.distributed's send, recv, isend and irecv so that each call is recorded (idempotent);
    returns the record. The wrappers call torch's own functions unchanged."""
    global RECORD
    if RECORD is not None:
        return RECORD
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    record = RECORD = Record(rank)
    inside = threading.local()

    known: dict = {}  # group -> its global ranks (groups live as long as the job)

    def wrap(name: str, op: str, blocking: bool, peer_kw: str, group_kw: str):
        original = getattr(c10d, name)

        def call(tensor, *args, **kw):
            if getattr(inside, "on", False):  # torch's send is isend(...).wait(): one call, one entry
                return original(tensor, *args, **kw)
            try:
                peer = args[0] if args else kw.get(peer_kw)
                group = args[1] if len(args) > 1 else kw.get("group")
                p, ranks = _peer_and_group(known, peer, group, kw.get(group_kw))
                entry = record.enter(op, tensor, p, ranks)
            except Exception:  # noqa: BLE001 - the record never stops the call
                entry = None
            inside.on = True
            try:
                result = original(tensor, *args, **kw)
            except BaseException:
                record.failed(entry)
                raise
            finally:
                inside.on = False
            if entry is not None:
                if blocking:
                    record.done(entry)
                elif result is not None:
                    with record.lock:
                        record.pending.append((entry, result))
            return result

        call.__wrapped__ = original
        call.__name__, call.__doc__ = original.__name__, original.__doc__
        setattr(c10d, name, call)
        setattr(dist, name, call)

    wrap("send", "send", True, "dst", "group_dst")
    wrap("recv", "recv", True, "src", "group_src")
    wrap("isend", "send", False, "dst", "group_dst")
    wrap("irecv", "recv", False, "src", "group_src")
    return record
