"""What a rank leaves behind once the stall watch declares a hang (train/stallwatch.py): its threads'
stacks and its Flight Recorder dump; rank 0 adds hang.json, the diagnosis and every rank's record.

    python -c "from simcluster.train.stalldump import hang_doc; print(hang_doc({}, 2, 60, {'idle_s': 61, 't': 0}))"

Files (docs/faults.md): ``RUN_DIR/stacks/rank-N.txt`` (faulthandler, every thread), the Flight
Recorder dump where the environment names one (train/flightrec.py, as NCCL's watchdog writes it on a
timeout), ``RUN_DIR/hang.json`` (written whole: a temporary file, then renamed). Nothing here
raises: a rank that cannot write says so in one line and goes on ending as a hang.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys

from simcluster.core.hang import HANG_FILE, STACKS_DIR
from simcluster.core.hang_diagnosis import diagnose
from simcluster.train import commstate
from simcluster.train.flightrec import write_dump


def write_stacks(out_dir: str, rank: int, idle_s: float) -> None:
    """This rank's stacks (every thread) and its Flight Recorder dump, at a stall of idle_s seconds."""
    folder = os.path.join(out_dir, STACKS_DIR)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank-{rank}.txt"), "w", encoding="utf-8") as fh:
            fh.write(f"rank {rank} pid {os.getpid()}: every thread's Python stack at the stall "
                     f"({idle_s} s without progress on any rank)\n")
            fh.flush()
            faulthandler.dump_traceback(fh, all_threads=True)
    except OSError:
        pass
    try:
        write_dump(rank, commstate.group_table())
    except Exception as e:  # noqa: BLE001 - the watch never stops the rank
        print(f"[simcluster] rank {rank}: no Flight Recorder dump: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def hang_doc(records: dict, world: int, stall_s: float, trigger: dict) -> dict:
    """hang.json's document: records (global rank -> its record, those that came), world (ranks of the
    job), stall_s (the limit), trigger ({"idle_s", "t"}: rank 0's declaration)."""
    return {"stall_s": stall_s, "idle_s": trigger["idle_s"], "time": trigger["t"], "world_size": world,
            "diagnosis": diagnose(records, world, trigger["idle_s"]),
            "missing": sorted(set(range(world)) - set(records)),
            "records": {str(r): v for r, v in sorted(records.items())}}


def write_hang(out_dir: str, doc: dict) -> None:
    """``out_dir/hang.json``, whole or not at all; its diagnosis printed, a line each."""
    path = os.path.join(out_dir, HANG_FILE)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(path + ".tmp", path)
    except OSError as e:
        print(f"[simcluster] could not write {path}: {e}", file=sys.stderr, flush=True)
    for line in doc["diagnosis"]:
        print(f"[simcluster] {line}", file=sys.stderr, flush=True)
