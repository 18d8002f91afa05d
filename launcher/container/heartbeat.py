"""A node's line to the rendezvous store: its heartbeat, the verdict it reads, its exit report.

    python -c "from simcluster.launcher.container.heartbeat import Heartbeat; help(Heartbeat)"

Runs inside a node container (launcher/container/node.py starts it); the store keys are those of
launcher/container/layout.py, served by launcher/container/rendezvous.py.

Rules of the quiet end (a store call to a store that has just closed fails loudly: torch prints
``recvValue failed`` and C++ stack frames): once the heartbeat reads FINISHED it sets this node's
CLOSED_KEY, drops its store client and beats no more; the rendezvous exits once every node that
waits has done so, and ``wait_gone`` sees that from a plain TCP connection to the store's port
(no store call, nothing sent) that the heartbeat opened just before setting CLOSED_KEY and that
the exiting rendezvous closes.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from datetime import timedelta

from simcluster.launcher.container.layout import CLOSED_KEY, EXIT_KEY, FINISHED, HB_KEY, NODE_KEY, REPORTED, VERDICT, report_key
from simcluster.core.layout import rank_range


def report(endpoint: str, node_name: str, node_rank: int, nproc: int, code: int, timeout_s: float = 15,
           reason: str | None = None, waits: bool = False) -> None:
    """Write this node's exit code (and why, when a fault or a signal stopped it) to the rendezvous
    store; warn (not fail) if it is gone. Gives up after timeout_s + 2 s even if the store hangs (a
    frozen rendezvous accepts but never answers). ``waits``: this node stays until the rendezvous
    exits, so the rendezvous waits for its CLOSED_KEY (see the module's rules). The client used
    here is closed when this returns."""
    worker = threading.Thread(target=_report, args=(endpoint, node_name, node_rank, nproc, code, timeout_s, reason,
                                                    waits), daemon=True)
    worker.start()
    worker.join(timeout_s + 2)
    if worker.is_alive():
        print(f"[{node_name}] could not report exit code {code} to {endpoint}: no answer in {timeout_s:g}s",
              file=sys.stderr, flush=True)


def _report(endpoint: str, node_name: str, node_rank: int, nproc: int, code: int, timeout_s: float,
            reason: str | None, waits: bool) -> None:
    record = {"node": node_name, "node_rank": node_rank, "ranks": rank_range(node_rank, nproc), "exit_code": code,
              "reason": reason, "waits": waits}
    try:
        import torch.distributed as dist

        host, _, port = endpoint.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        store.set(EXIT_KEY + node_name, json.dumps(record))
        index = store.add(REPORTED, 1)
        store.set(report_key(index), node_name)
        print(f"[{node_name}] reported exit code {code} to {endpoint}", flush=True)
    except Exception as e:  # the rendezvous may have given up already
        print(f"[{node_name}] could not report exit code {code} to {endpoint}: {e}", file=sys.stderr, flush=True)


def open_watch(endpoint: str, timeout_s: float = 2.0) -> socket.socket | None:
    """A plain TCP connection to the rendezvous store's port, nothing sent on it (the store's
    server ignores it); None if it cannot be opened. Open it while the rendezvous is sure to be up:
    once its container is gone, looking up its name takes Docker's DNS 10 s to fail."""
    host, _, port = endpoint.rpartition(":")
    try:
        return socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError:
        return None


def wait_gone(watch: socket.socket | None, timeout_s: float) -> bool:
    """Wait until the rendezvous has exited, without a store call: its exiting process closes the
    ``watch`` connection (open_watch), or it fails. True once gone (at once for no watch), False if
    still open after timeout_s. Closes watch."""
    if watch is None:
        return True
    deadline = time.monotonic() + timeout_s
    with watch:
        while (left := deadline - time.monotonic()) > 0:
            watch.settimeout(min(left, 1.0))
            try:
                if not watch.recv(1):
                    return True
            except TimeoutError:
                continue
            except OSError:
                return True
    return False


class Heartbeat(threading.Thread):
    """Registers this node in the rendezvous store, bumps its heartbeat counter every
    ``interval`` seconds and picks up the rendezvous' verdict (lost nodes) and finish flag.
    ``last_ok`` is the monotonic time of the last store call that went through. Once FINISHED
    is read (the verdict re-read in the same beat is final), it sets this node's CLOSED_KEY,
    closes its client and ends: ``finished`` is then True, ``watch`` the connection to wait on
    (open_watch, opened just before) and ``last_ok`` stays put."""

    def __init__(self, endpoint: str, name: str, node_rank: int, nproc: int, interval: float = 1.0):
        super().__init__(daemon=True, name="heartbeat")
        self.endpoint, self.name, self.node_rank, self.nproc, self.interval = endpoint, name, node_rank, nproc, interval
        self.last_ok = time.monotonic()
        self.verdict: dict | None = None
        self.finished = False
        self.ever_ok = False  # until the first contact, the join timeout applies instead
        self.watch: socket.socket | None = None  # once finished: the connection wait_gone watches
        self.halt = threading.Event()

    def _connect(self):
        import torch.distributed as dist

        host, _, port = self.endpoint.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
        store.set(NODE_KEY + str(self.node_rank), json.dumps({
            "node": self.name, "node_rank": self.node_rank, "nproc": self.nproc,
            "ranks": rank_range(self.node_rank, self.nproc)}))
        return store

    def run(self) -> None:
        store = None
        while not self.halt.is_set():
            try:
                store = store or self._connect()
                store.add(HB_KEY + str(self.node_rank), 1)
                finished = store.check([FINISHED])  # before the verdict: the rendezvous sets it first
                if store.check([VERDICT]):  # re-read: a failure may be joined by a lost node later
                    self.verdict = json.loads(store.get(VERDICT).decode())
                self.last_ok, self.ever_ok = time.monotonic(), True
                if finished:
                    self.watch = open_watch(self.endpoint)  # before CLOSED_KEY: the rendezvous waits for that
                    self.finished = True
                    store.set(CLOSED_KEY + str(self.node_rank), "1")  # the rendezvous exits once it has these
                    return  # the client goes with this frame: no store call can fail after the store has closed
            except Exception:  # noqa: BLE001 - store gone or unreachable: reconnect next beat
                store = None
                if self.finished:
                    return
            self.halt.wait(self.interval)

    def lost_message(self) -> str | None:
        """The verdict naming the lost or failed node(s) other than this one, else None."""
        if not self.verdict:
            return None
        lost = [f"{x['node']} (ranks {x['ranks']}) lost: {x['reason']}" for x in self.verdict.get("lost", [])
                if x.get("node_rank") != self.node_rank]
        failed = [f"{x['node']} (ranks {x['ranks']}) failed with exit {x['exit_code']}"
                  + (f" ({x['reason']})" if x.get("reason") else "") for x in self.verdict.get("failed", [])
                  if x.get("node_rank") != self.node_rank]
        return "; ".join(lost + failed) or None
