"""A node's ranks watched to their end (the node wrapper's second half, launcher/container/node.py): stopped
when the rendezvous names a lost node, cannot be reached, or a rank of this node is frozen; signals
forwarded; torchrun's exit turned into the node's (EXIT_HANG when the stall watch ended the ranks); then
the stay until the rendezvous' verdict, so that `compose up --exit-code-from rendezvous` reports it.

    python -c "from simcluster.launcher.container.supervise import STOP_GRACE_S; print(STOP_GRACE_S)"
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from simcluster.launcher.container.heartbeat import Heartbeat, wait_gone
from simcluster.launcher.container.ranks import frozen
from simcluster.launcher.container.layout import JOIN_TIMEOUT_S
from simcluster.core.layout import node_ranks, rank_range
from simcluster.core.hang import EXIT_HANG, read_hang

STOP_GRACE_S = 2.0  # on a fault: SIGTERM to torchrun, then SIGKILL after this (the container ends with us)
GONE_WAIT_S = 15.0  # after FINISHED, wait this long at most for the rendezvous to exit (it takes a few seconds)
LINGER_S = 1.0  # then stay this long, so Compose sees the rendezvous' container end before this one


def supervise(proc: subprocess.Popen, hb: Heartbeat, name: str, ranks: str, silent_s: float,
              join_s: float = JOIN_TIMEOUT_S, first_rank: int = 0) -> tuple[int, str | None]:
    """Wait for torchrun; stop it when the rendezvous names a lost node, cannot be reached for
    silent_s seconds (join_s before the first contact), or a rank process of this node has been
    frozen (stopped) for silent_s. ``proc``: torchrun's process, or train/forkrun.py's ForkedAgent (the same
    poll, pid, send_signal and kill). Returns (exit code, why it was stopped; None if it ended itself)."""
    stop_at, why, since, last_scan = None, None, {}, 0.0
    while True:
        code = proc.poll()
        if code is not None:
            return code, why
        now = time.monotonic()
        if stop_at is None:
            why = hb.lost_message()
            if why is None and now - hb.last_ok > (silent_s if hb.ever_ok else join_s):
                why = (f"{name} (ranks {ranks}) lost: cannot reach the rendezvous at {hb.endpoint} for "
                       f"{now - hb.last_ok:.0f}s (this node is cut off, or the rendezvous is gone)")
            if why is None and now - last_scan >= 1.0:
                last_scan = now
                stuck = frozen(proc.pid, first_rank)
                since = {r: since.get(r, now) for r in stuck}
                long = sorted(r for r, t in since.items() if now - t >= silent_s)
                if long:
                    why = (f"rank {', '.join(map(str, long))} on {name} frozen: its process is stopped (SIGSTOP) "
                           f"for {now - since[long[0]]:.0f}s (limit {silent_s:g}s)")
            if why:
                print(f"[{name}] error: {why}; stopping ranks {ranks}", file=sys.stderr, flush=True)
                proc.send_signal(signal.SIGTERM)
                stop_at = now
        elif now - stop_at > STOP_GRACE_S:
            proc.kill()
        time.sleep(0.25)


def wait_for(path: str, timeout_s: float, name: str) -> bool:
    """Wait (polling every 0.1 s) until ``path`` exists; print its first line (the shaped qdisc).
    False, with an error line, after ``timeout_s``."""
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout_s:
            print(f"[{name}] error: {path} did not appear within {timeout_s:g}s: the launcher did not shape this "
                  f"node's network; see its output", file=sys.stderr, flush=True)
            return False
        time.sleep(0.1)
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = fh.readline().strip()
    print(f"[{name}] network shaped after {time.monotonic() - t0:.1f}s: {first}", flush=True)
    return True


def run_ranks(proc, hb: Heartbeat, args: argparse.Namespace, name: str, started: float) -> tuple[int, str | None, list]:
    """Supervise the started ranks to their end, signals forwarded to them: (this node's exit code, why
    it failed or was stopped, the signals that stopped it). A hang.json of this run turns torchrun's 1
    into EXIT_HANG."""
    signalled: list[int] = []

    def forward(signum, _frame):
        signalled.append(signum)
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    first_rank = node_ranks(args.node_rank, args.nproc_per_node).start
    ranks = rank_range(args.node_rank, args.nproc_per_node)
    code, why = supervise(proc, hb, name, ranks, args.lost_after_s, args.join_timeout_s, first_rank)
    code = 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell
    if signalled:  # `docker stop` (SIGTERM) or Ctrl-C: stopped, not crashed
        code, why = 128 + signalled[0], f"stopped by {signal.Signals(signalled[0]).name}"
    code = code or (1 if why else 0)
    if code and not why and args.run_dir and read_hang(args.run_dir, started):  # torchrun's 1 for ranks that exited 4
        code, why = EXIT_HANG, "its ranks ended by the stall watch: hang.json"
    print(f"[{name}] torchrun exited {code}" + (f" ({why})" if why else ""), flush=True)
    return code, why, signalled


def await_verdict(hb: Heartbeat, name: str, ranks: str, failed: bool, limit_s: float = 120.0) -> None:
    """Stay until the rendezvous has exited, at most limit_s, so that ``docker compose up
    --exit-code-from rendezvous`` reports the rendezvous' verdict rather than the abort of a node
    that left first. A failed node prints the lost node named by the verdict. Once the heartbeat
    has read FINISHED (and closed its client), wait for the exit without a store call (at most
    GONE_WAIT_S), then LINGER_S; before that, or if it never comes, until the store stops
    answering for 2.5 s."""
    t0, named = time.monotonic(), False
    while time.monotonic() - t0 < limit_s and time.monotonic() - hb.last_ok < 2.5:
        why = hb.lost_message()
        if failed and why and not named:
            print(f"[{name}] error: {why}; ranks {ranks} stopped", file=sys.stderr, flush=True)
            named = True
        if hb.finished:
            if wait_gone(hb.watch, min(GONE_WAIT_S, max(limit_s - (time.monotonic() - t0), 0.0))):
                time.sleep(LINGER_S)
            return
        time.sleep(0.25)
