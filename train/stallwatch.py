"""The stall watch of one rank: progress published, a stall declared, every rank's stacks and
record collected, the diagnosis written, the job ended.

    python -c "from simcluster.train.stallwatch import GRACE_S, POLL_S; print(GRACE_S, POLL_S)"

Each rank of a job (the built-in trainer, train/trainer.py; your code, through the instruments,
launcher/instrument/rank.py) starts one daemon thread, ``Watch``, with its own client of the default
group's store. Once a beat (train/stallstate.py ``beat_s``: 1 s up to 64 ranks) it publishes when
the rank last progressed (a collective completed, a send/recv completed, a step ended, a
torch.compile under way) and since when it waits in communication, with the collectives under way
(train/commstate.py); from its first completed call or step on (a start-up is left to the group's timeout).

A hang is a rank waiting in communication while no rank progresses for ``stall_s`` (from the later
of the last progress and the longest wait's start), unless every waiting rank is inside one
collective with all of its group (under way: a note, not a hang). Before declaring, rank 0 asks
every rank what it does; a rank that cannot answer within NOTE_WAIT_S and two beats holds the GIL
(it works, as a compile does). Every rank outside communication that long (compiling, loading,
saving, sleeping) gets one note, ``[simcluster] note: ...``, and the job goes on. The signals go
through one counter every rank reads once a beat (ASK: +1 asks, +DECLARE declares). Declared,
every rank leaves its stacks and Flight Recorder dump (train/stalldump.py) and publishes its record;
rank 0 collects them (at most COLLECT_S and two beats), writes hang.json with the diagnosis, sets
EXIT, and every rank exits EXIT_HANG (4); an error its main thread meets after that (a peer left
first) ends it with EXIT_HANG too, quietly (``declared``). ``destroy_process_group`` (or the
interpreter's exit) stops the watch and joins its thread before the interpreter's teardown.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from datetime import timedelta

from simcluster.core.hang import EXIT_HANG, stall_limit
from simcluster.train import commrecord, commstate
from simcluster.train.stallstate import RankState, beat_s, parse, under_way
from simcluster.core.hang_diagnosis import quiet_note, slow_note
from simcluster.train.runtime import name_thread
from simcluster.train.stalldump import hang_doc, write_hang, write_stacks

PREFIX = "simcluster/stall/"
DUMP, EXIT, DUMPED = PREFIX + "dump", PREFIX + "exit", PREFIX + "dumped"
GRACE_S = 30.0  # with the watch on, the trainer's process-group timeout is at least stall_s + this
COLLECT_S = 20.0  # rank 0 waits this long at most for every rank's record (the first snapshot symbolizes up to 2000 Flight Recorder stacks: about 1.4 s of CPU per rank)
POLL_S = 1.0  # the watch's period up to 64 ranks (train/stallstate.py beat_s: longer beyond)
EXIT_LAG_S = 1.5  # rank 0 exits this long after EXIT is set (the others poll for it every 0.2 s)
ASK = PREFIX + "ask"  # the signal counter every rank reads once a beat (see the module's docstring)
DECLARE = 1 << 40  # added to ASK when the hang is declared (notes add 1)
THREAD_NAME = "sc-stallwatch"  # its OS thread's name (/proc/PID/task/TID/comm; bench/rank_cost.py)
NOTE_WAIT_S = 3.0  # rank 0 waits this long (plus two beats) at most for every rank's answer to a note's question

STEPS = [0]  # steps this process ended (note_step)
WATCH: "Watch | None" = None


def group_timeout_s(stall_s: float | None, timeout_s: float) -> float:
    """The process group's timeout (s): the job's, raised to the stall limit + GRACE_S with the watch on,
    so that the diagnosis comes first (a --stall-s above --timeout-s raises the timeout with it)."""
    stall = stall_limit(stall_s, timeout_s)
    return max(float(timeout_s), stall + GRACE_S) if stall else float(timeout_s)


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
        self.beat = POLL_S  # s, set from the world's size once connected
        self.fingerprint = None
        self.last_t = self.wait_since = 0.0  # UNIX times: the last progress (0: none yet), the wait's start (0: none)
        self.published: tuple | None = None
        self.answered = 0  # the last note question answered
        self.noted = 0.0  # the last progress time a note was printed for (rank 0)
        self.main = threading.main_thread()

    def _connect(self) -> bool:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_initialized():
            return False
        self.world = dist.get_world_size()
        self.beat = beat_s(self.world, self.stall_s)
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
        name_thread(THREAD_NAME)
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
                self.wake.wait(self.beat)
            if not self.declared and self.last_t:  # a rank that leaves waits no more
                self.store.set(f"{PREFIX}progress/{self.rank}", f"{time.time()!r} 0.0")
        except Exception as e:  # noqa: BLE001 - the watch never stops the rank; a store gone ends it
            if not self.finished and not isinstance(e, (ConnectionError, OSError, RuntimeError)):
                print(f"[simcluster] stall watch stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            self.store = None  # the client closed here, in this thread

    def _beat(self) -> None:
        now = time.time()
        record = commrecord.RECORD
        completed, pending = commstate.fr_status()
        progress = (STEPS[0], record.poll() if record else 0, completed)
        if progress != self.fingerprint and any(progress):  # from its first completed call or step on
            self.fingerprint, self.last_t = progress, now
        elif self.last_t and commstate.compiling(sys._current_frames().get(self.main.ident)):
            self.last_t = now
        if record and record.open > 0:
            pending = [*pending, ("p2p", 0, 0)]  # a send/recv under way: never a collective's member
        self.wait_since = (self.wait_since or now) if pending else 0.0
        state = RankState(self.last_t, self.wait_since, tuple(pending))
        if self.last_t and state != self.published:
            self.published = state
            self.store.set(f"{PREFIX}progress/{self.rank}", state.text())
        signal = self.store.add(ASK, 0)
        if self.rank == 0 and signal < DECLARE:
            signal = self._watch(signal)
        if signal >= DECLARE:
            self._dump()
        elif signal > self.answered:
            self._answer(signal)

    def _watch(self, signal: int) -> int:
        """Rank 0: declare the hang, or print a note, from every rank's published state; returns ASK's value."""
        keys = [f"{PREFIX}progress/{r}" for r in range(self.world)]
        if not self.store.check(keys):
            return signal
        states = [parse(v.decode()) for v in self.store.multi_get(keys)]
        last = max(s.last_t for s in states)
        waits = [s.wait_since for s in states if s.wait_since]
        now = time.time()
        if waits and now - max(last, min(waits)) >= self.stall_s and (call := under_way(states)):
            if self.noted != last:  # every waiting rank is inside a collective with all its group: slow, not hung
                self.noted = last
                print(f"[simcluster] note: {slow_note(call, now - max(last, min(waits)), self.stall_s)}",
                      file=sys.stderr, flush=True)
            return signal
        if waits and now - max(last, min(waits)) >= self.stall_s:
            signal = self.store.add(ASK, 1)  # every rank asked first: one too busy to answer is working
            if len(self._ask(signal)) < self.world:  # (its watch starved of the GIL, e.g. compiling: progress
                return signal                        # it could not publish), not waiting: a wait releases the GIL
            idle = time.time() - max(last, min(waits))
            self.store.set(DUMP, json.dumps({"idle_s": round(idle, 1), "t": now}))
            return self.store.add(ASK, DECLARE)
        if not waits and now - last >= self.stall_s and self.noted != last:
            self.noted = last
            signal = self.store.add(ASK, 1)
            self._note(signal, now - last)
        return signal

    def _doing(self) -> str:
        frame = sys._current_frames().get(self.main.ident)
        return ("compiling (torch.compile) " if commstate.compiling(frame) else "") + "at " + self._top()

    def _answer(self, question: int) -> None:
        self.answered = question
        self.store.set(f"{PREFIX}doing/{question}/{self.rank}", self._doing())

    def _ask(self, question: int) -> dict[int, str]:
        """Rank 0: every rank's answer to question (what its main thread does), those that came within
        NOTE_WAIT_S (each rank answers on its next beat)."""
        self._answer(question)
        keys = {r: f"{PREFIX}doing/{question}/{r}" for r in range(self.world)}
        deadline = time.monotonic() + NOTE_WAIT_S + 2 * self.beat
        while time.monotonic() < deadline and not self.store.check(list(keys.values())):
            self.wake.wait(0.2)
        return {r: self.store.get(k).decode() for r, k in keys.items() if self.store.check([k])}

    def _note(self, question: int, quiet_s: float) -> None:
        """Rank 0: every rank's answer to question, printed as one note."""
        doing = self._ask(question)
        print(f"[simcluster] {quiet_note(doing, self.world, quiet_s, self.stall_s)}", file=sys.stderr, flush=True)

    def _top(self) -> str:
        frame = sys._current_frames().get(self.main.ident)
        return commrecord.frame_text(frame) if frame is not None else "?"

    def _dump(self) -> None:
        self.finished = self.declared = True
        if not hasattr(sys.excepthook, "__wrapped__"):
            sys.excepthook = _hook(sys.excepthook)  # forked ranks: train/forked_rank.py asks declared()
        trigger = json.loads(self.store.get(DUMP).decode())
        write_stacks(self.out_dir, self.rank, trigger["idle_s"])
        record = commrecord.RECORD.snapshot() if commrecord.RECORD else {"rank": self.rank}
        record.update(step=STEPS[0], top=self._top(), pid=os.getpid())
        self.store.set(f"{PREFIX}record/{self.rank}", json.dumps(record))
        self.store.add(DUMPED, 1)
        if self.rank == 0:
            self._conclude(trigger)
            time.sleep(EXIT_LAG_S)  # the others leave first: none sees its peer's socket close and raises
        deadline = time.monotonic() + COLLECT_S + 2 * self.beat + 15
        while time.monotonic() < deadline and not self.store.check([EXIT]):
            time.sleep(0.2)
        exit_as_hang()

    def _conclude(self, trigger: dict) -> None:
        deadline = time.monotonic() + COLLECT_S + 2 * self.beat  # every rank sees the signal within a beat
        while time.monotonic() < deadline and self.store.add(DUMPED, 0) < self.world:
            time.sleep(0.2)
        records = {}
        for r in range(self.world):
            key = f"{PREFIX}record/{r}"
            if self.store.check([key]):
                records[r] = json.loads(self.store.get(key).decode())
        write_hang(self.out_dir, hang_doc(records, self.world, self.stall_s, trigger))
        self.store.set(EXIT, "1")
