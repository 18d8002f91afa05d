"""The stall watch of one rank: progress published, a stall declared, every rank's stacks and
record collected, the diagnosis written, the job ended.

    python -c "from simcluster.train.stallwatch import GRACE_S, POLL_S; print(GRACE_S, POLL_S)"

Each rank of a job (the built-in trainer, train/trainer.py; your code, through the instruments,
launcher/instrument/rank.py) starts one daemon thread, ``Watch``. Once the rank's default process
group exists it opens its own client of that group's store (a connection of its own: a
blocking store call of the rank never holds it) and, every second, publishes when it last made
progress: a collective completed (Flight Recorder's count), a point-to-point call completed
(train/commrecord.py) or a step ended (``note_step``). Rank 0 also watches: once every rank has
published, and no rank has made progress for ``stall_s`` seconds, it sets DUMP. A rank publishes
from its first completed call or step on, so the clock starts once every rank has completed one:
a start-up, however long (256 ranks importing and building on 2 cores), is over by then, since
the first collective completes only when its slowest rank reaches it. A hang before every rank's
first completed call is left to the process group's timeout. Every
rank then writes ``RUN_DIR/stacks/rank-N.txt`` (faulthandler: every thread's Python stack) and
writes its Flight Recorder dump where the environment names one (train/flightrec.py: as NCCL's
watchdog would on a timeout), publishes its record (commrecord.Record.snapshot with its step and
its main thread's top frame);
rank 0 waits for them (at most COLLECT_S), writes ``RUN_DIR/hang.json`` (the diagnosis,
simcluster/core/hang_diagnosis.py, and every record), prints the diagnosis, sets EXIT, and every rank exits
with EXIT_HANG (4). Once a rank has seen the stall declared, an error its main thread meets (a peer
that left first closed its socket) ends it with EXIT_HANG too, quietly: ``declared``.
``destroy_process_group`` (or the interpreter's exit) stops the watch and waits for its thread, so
its store client is closed there, before the interpreter's teardown.
"""
from __future__ import annotations

import atexit
import faulthandler
import json
import os
import sys
import threading
import time
from datetime import timedelta

from simcluster.core.hang import EXIT_HANG, HANG_FILE, STACKS_DIR
from simcluster.train import commrecord
from simcluster.train.flightrec import write_dump
from simcluster.core.hang_diagnosis import diagnose

PREFIX = "simcluster/stall/"
DUMP, EXIT, DUMPED = PREFIX + "dump", PREFIX + "exit", PREFIX + "dumped"
GRACE_S = 30.0  # with the watch on, the trainer's process-group timeout is at least stall_s + this
COLLECT_S = 20.0  # rank 0 waits this long at most for every rank's record (the first snapshot symbolizes up to 2000 Flight Recorder stacks: about 1.4 s of CPU per rank)
POLL_S = 1.0
EXIT_LAG_S = 1.5  # rank 0 exits this long after EXIT is set (the others poll for it every 0.2 s)

STEPS = [0]  # steps this process ended (note_step)
WATCH: "Watch | None" = None


def declared() -> bool:
    """True once this rank's watch has seen the stall declared: from then on the rank is ending as a
    hang, and an error its main thread meets (a peer that already exited closed its socket) is a
    consequence, not a failure of its own (``exit_as_hang``)."""
    return WATCH is not None and WATCH.declared


def exit_as_hang() -> None:
    """End this process with EXIT_HANG at once, quietly (its streams flushed)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_HANG)


def _hook(inner):
    def hook(kind, value, tb):  # a fresh interpreter's main thread raising after the stall was declared
        if declared():
            exit_as_hang()
        inner(kind, value, tb)
    hook.__wrapped__ = inner
    return hook


def note_step() -> None:
    """A step ended on this rank (progress for the stall clock)."""
    STEPS[0] += 1


def start(stall_s: float, out_dir: str | None, rank: int) -> "Watch | None":
    """Record this rank's communication (commrecord.install) and start its watch (idempotent);
    None when off (stall_s 0, or no run folder to write to)."""
    global WATCH
    if WATCH is not None or not stall_s or not out_dir:
        return WATCH
    commrecord.install(rank)
    _mark_destroy()
    WATCH = Watch(stall_s, out_dir, rank)
    WATCH.start()
    atexit.register(WATCH.stop)  # a program that never destroys its group: the watch still ends before teardown
    return WATCH


def _mark_destroy() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group

    def destroy(group=None):
        if group is None and WATCH is not None:
            WATCH.stop()
        return original(group)

    destroy.__wrapped__ = original
    c10d.destroy_process_group = dist.destroy_process_group = destroy


class Watch(threading.Thread):
    """The stall watch of one rank (see the module's docstring)."""

    def __init__(self, stall_s: float, out_dir: str, rank: int):
        super().__init__(daemon=True, name="simcluster-stall-watch")
        self.stall_s, self.out_dir, self.rank = float(stall_s), out_dir, rank
        self.finished = self.declared = False
        self.wake = threading.Event()  # set by stop(): the watch's waits end at once
        self.store = None
        self.world = 1
        self.fingerprint = None
        self.main = threading.main_thread()

    def _connect(self) -> bool:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_initialized():
            return False
        self.world = dist.get_world_size()
        store = c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        if not hasattr(store, "host"):
            return False
        self.store = dist.TCPStore(store.host, store.port, is_master=False, wait_for_workers=False,
                                   timeout=timedelta(seconds=30))
        return True

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the watch (the default group is being destroyed, or the interpreter exits) and wait for
        its thread, at most timeout_s: its store client is released in its own thread, never at the
        interpreter's teardown (where a C++ thread outliving it aborts the process at exit)."""
        self.finished = True
        self.wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)

    def run(self) -> None:
        try:
            while self.store is None:
                if self.finished or not self._connect():
                    if self.finished:
                        return
                    self.wake.wait(0.5)
            if self.world < 2:
                return
            while not self.finished:
                self._beat()
                self.wake.wait(POLL_S)
        except Exception as e:  # noqa: BLE001 - the watch never stops the rank; a store gone ends it
            if not self.finished and not isinstance(e, (ConnectionError, OSError, RuntimeError)):
                print(f"[simcluster] stall watch stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            self.store = None  # the client closed here, in this thread

    def _beat(self) -> None:
        progress = (STEPS[0], commrecord.RECORD.poll() if commrecord.RECORD else 0, commrecord.fr_completed())
        if progress != self.fingerprint and any(progress):  # from its first completed call or step on
            self.fingerprint = progress
            self.store.set(f"{PREFIX}progress/{self.rank}", repr(time.time()))
        if self.rank == 0 and not self.store.check([DUMP]):
            self._watch()
        if self.store.check([DUMP]):
            self._dump()

    def _watch(self) -> None:
        keys = [f"{PREFIX}progress/{r}" for r in range(self.world)]
        if not self.store.check(keys):
            return
        last = max(float(v.decode()) for v in self.store.multi_get(keys))
        idle = time.time() - last
        if idle >= self.stall_s:
            self.store.set(DUMP, json.dumps({"idle_s": round(idle, 1), "t": time.time()}))

    def _top(self) -> str:
        frame = sys._current_frames().get(self.main.ident)
        return commrecord.frame_text(frame) if frame is not None else "?"

    def _dump(self) -> None:
        self.finished = self.declared = True
        if not hasattr(sys.excepthook, "__wrapped__"):
            sys.excepthook = _hook(sys.excepthook)  # forked ranks: train/forked_rank.py asks declared()
        trigger = json.loads(self.store.get(DUMP).decode())
        folder = os.path.join(self.out_dir, STACKS_DIR)
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"rank-{self.rank}.txt"), "w", encoding="utf-8") as fh:
                fh.write(f"rank {self.rank} pid {os.getpid()}: every thread's Python stack at the stall "
                         f"({trigger['idle_s']} s without progress on any rank)\n")
                fh.flush()
                faulthandler.dump_traceback(fh, all_threads=True)
        except OSError:
            pass
        try:  # the Flight Recorder's dump, as NCCL's watchdog writes it on a timeout (train/flightrec.py)
            write_dump(self.rank, commrecord.group_table())
        except Exception as e:  # noqa: BLE001 - the watch never stops the rank
            print(f"[simcluster] rank {self.rank}: no Flight Recorder dump: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
        record = commrecord.RECORD.snapshot() if commrecord.RECORD else {"rank": self.rank}
        record.update(step=STEPS[0], top=self._top(), pid=os.getpid())
        self.store.set(f"{PREFIX}record/{self.rank}", json.dumps(record))
        self.store.add(DUMPED, 1)
        if self.rank == 0:
            self._conclude(trigger)
            time.sleep(EXIT_LAG_S)  # the others leave first: none sees its peer's socket close and raises
        deadline = time.monotonic() + COLLECT_S + 15
        while time.monotonic() < deadline and not self.store.check([EXIT]):
            time.sleep(0.2)
        exit_as_hang()

    def _conclude(self, trigger: dict) -> None:
        deadline = time.monotonic() + COLLECT_S
        while time.monotonic() < deadline and self.store.add(DUMPED, 0) < self.world:
            time.sleep(0.2)
        records = {}
        for r in range(self.world):
            key = f"{PREFIX}record/{r}"
            if self.store.check([key]):
                records[r] = json.loads(self.store.get(key).decode())
        lines = diagnose(records, self.world, trigger["idle_s"])
        doc = {"stall_s": self.stall_s, "idle_s": trigger["idle_s"], "time": trigger["t"], "world_size": self.world,
               "diagnosis": lines, "missing": sorted(set(range(self.world)) - set(records)),
               "records": {str(r): v for r, v in sorted(records.items())}}
        path = os.path.join(self.out_dir, HANG_FILE)
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1)
            os.replace(path + ".tmp", path)
        except OSError as e:
            print(f"[simcluster] could not write {path}: {e}", file=sys.stderr, flush=True)
        for line in lines:
            print(f"[simcluster] {line}", file=sys.stderr, flush=True)
        self.store.set(EXIT, "1")
