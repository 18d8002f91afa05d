"""Rendezvous service: the cluster's TCPStore, which also collects each node's exit code and
watches every node's heartbeat, naming the node that is lost.

    python -m launcher.container.rendezvous --port 29400 --nnodes 2 --lost-after-s 24
                                            [--grace-s 30] [--timeout-s 0] [--join-timeout-s 300]

Hosts torch.distributed.TCPStore on 0.0.0.0:PORT (torchrun's c10d rendezvous and the
workers' process-group bootstrap use it). Each node wrapper (launcher/container/node.py) registers,
bumps a heartbeat counter every second, and reports its exit code when its torchrun ends;
once all NNODES reported, this prints one line per node (name, ranks, exit code) and exits 0
only if every node exited 0 -- which is what lets a plain ``docker compose up`` end by itself.
After a node reports failure, the verdict names it, every other node stops its ranks (as
torchrun's agent stops a failed worker's peers) and they get GRACE_S seconds to report before
this exits 1 (closing the store, which ends them too).

Fault detection: a node whose heartbeat stops for --lost-after-s seconds (its container was
killed, frozen with ``docker pause`` or cut off the network), or that never registered
within --join-timeout-s of the start (started too late, or not at all), is declared lost: this
prints ``rendezvous: LOST node-K (ranks a-b): <reason>`` and publishes the verdict in the
store, where every surviving node wrapper reads it, prints it as its error and stops its
ranks. The job then ends non-zero with the lost node named in the summary.

Quiet end: once the verdict is final this sets FINISHED, prints the summary and waits (at most
CLOSE_WAIT_S) until every node that reported it waits has set its CLOSED_KEY -- its heartbeat
read FINISHED and closed its store client -- then exits, closing the store, which is what the
waiting nodes watch for (launcher/container/heartbeat.py). No node makes a store call after
that, so none prints torch's ``recvValue failed`` and stack frames. Lost nodes are not waited for.
The process ends right after the store closes (os._exit), so its container is gone first.

Store protocol: the keys in launcher/container/layout.py, shared with launcher/container/node.py.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta

from simcluster.launcher.container.layout import CLOSED_KEY, EXIT_KEY, FINISHED, HB_KEY, JOIN_TIMEOUT_S, NODE_KEY, REPORTED, VERDICT, report_key
from simcluster.core.layout import node_name, rank_range

GRACE_S = 30.0  # after one node failed, the others get this long to report
CLOSE_WAIT_S = 5.0  # after FINISHED, wait this long at most for the waiting nodes to close their clients


def verdict_message(lost: list[dict]) -> str:
    """One line naming every lost node, its ranks and why."""
    return "; ".join(f"{x['node']} (ranks {x['ranks']}) lost: {x['reason']}" for x in lost)


def summary(reports: dict[str, dict], nnodes: int, lost: list[dict] | None = None) -> tuple[list[str], int]:
    """Summary lines (one per node, sorted by name) and the exit status: 0 iff all nnodes
    nodes reported exit code 0, else 1. ``lost`` nodes (see serve) get a LOST line."""
    lost = [x for x in (lost or []) if x["node"] not in reports]
    rows = [(name, f"  {name:<10} ranks {r.get('ranks', '?'):<9} exit {r.get('exit_code')}"
                   + (f" ({r['reason']})" if r.get("reason") else "")) for name, r in reports.items()]
    rows += [(x["node"], f"  {x['node']:<10} ranks {x['ranks']:<9} LOST: {x['reason']}") for x in lost]
    lines = [line for _, line in sorted(rows)]
    missing = nnodes - len(reports) - len(lost)
    if missing > 0:
        lines.append(f"  {missing} node(s) never reported (container killed or never started)")
    ok = missing <= 0 and not lost and all(r.get("exit_code") == 0 for r in reports.values())
    return lines, 0 if ok else 1


class Nodes:
    """What the rendezvous knows of a job's nodes: their registrations and heartbeats (when each was
    last seen, monotonic s), their exit reports, the nodes lost, the first failure, and the deadline
    a failure or a loss sets for the others to stop."""

    def __init__(self, store, nnodes: int, grace_s: float, lost_after_s: float, join_timeout_s: float):
        self.store, self.nnodes, self.grace_s = store, nnodes, grace_s
        self.lost_after_s, self.join_timeout_s = lost_after_s, join_timeout_s
        self.start = time.monotonic()
        self.nodes = [{"k": k, "name": node_name(k, nnodes), "registered": False, "hb": 0, "seen": None}
                      for k in range(nnodes)]
        self.reports: dict[str, dict] = {}
        self.nproc: int | None = None
        self.lost: list[dict] = []
        self.failed: list[dict] = []  # the first node that reported a failure (published in the verdict)
        self.seen = 0
        self.deadline: float | None = None

    def publish(self) -> None:
        self.store.set(VERDICT, json.dumps({"lost": self.lost, "failed": self.failed,
                                            "message": verdict_message(self.lost)}))

    def restart_clocks(self, now: float) -> None:
        """This process itself stalled: silence proves nothing, every heard node counts as seen now."""
        for n in self.nodes:
            n["seen"] = now if n["seen"] is not None else None

    def listen(self, now: float) -> None:
        """Registrations and heartbeats read from the store."""
        store = self.store
        for n in self.nodes:
            if not n["registered"] and store.check([NODE_KEY + str(n["k"])]):
                info = json.loads(store.get(NODE_KEY + str(n["k"])).decode())
                n.update(registered=True, name=info.get("node", n["name"]))
                self.nproc = self.nproc or info.get("nproc")
                print(f"rendezvous: {n['name']} (ranks {info.get('ranks')}) joined after {now - self.start:.1f}s",
                      flush=True)
            hb = store.add(HB_KEY + str(n["k"]), 0)
            if hb != n["hb"] or (n["registered"] and n["seen"] is None):
                n["hb"], n["seen"] = hb, now

    def collect(self) -> None:
        """The exit reports published since the last call; the first failure published as the verdict."""
        count = self.store.add(REPORTED, 0)
        while self.seen < count:
            self.seen += 1
            name = self.store.get(report_key(self.seen)).decode()
            report = json.loads(self.store.get(EXIT_KEY + name).decode())
            self.reports[name] = report
            why = f" ({report['reason']})" if report.get("reason") else ""
            print(f"rendezvous: {name} (ranks {report.get('ranks')}) exited {report.get('exit_code')}{why}", flush=True)
            if report.get("exit_code") != 0 and not self.failed:
                self.failed.append(report)  # the job is over: every other node stops its ranks now
                self.publish()
            if report.get("exit_code") != 0 and self.deadline is None:
                wait = self.grace_s if not any(n["seen"] for n in self.nodes) else max(self.grace_s, self.lost_after_s + 3)
                self.deadline = time.monotonic() + wait
                print(f"rendezvous: {name} failed; the other nodes stop, waiting up to {wait:g}s for them", flush=True)

    def find_lost(self, now: float) -> None:
        """Nodes silent past lost_after_s, or never joined within the join timeout: lost, published."""
        done_names = set(self.reports) | {x["node"] for x in self.lost}
        newly = []
        for n in self.nodes:
            if n["name"] in done_names or any(r.get("node_rank") == n["k"] for r in self.reports.values()):
                continue
            if n["seen"] is not None and now - n["seen"] > self.lost_after_s:
                reason = (f"no heartbeat for {now - n['seen']:.0f}s (container killed, frozen or cut off the network; "
                          f"limit {self.lost_after_s:g}s)")
            elif n["seen"] is None and now - self.start > self.join_timeout_s:
                reason = f"never joined within the {self.join_timeout_s:g}s join timeout (started late or not at all)"
            else:
                continue
            newly.append({"node": n["name"], "node_rank": n["k"], "ranks": rank_range(n["k"], self.nproc),
                          "reason": reason})
        if newly:
            self.lost += newly
            for x in newly:
                print(f"rendezvous: LOST {x['node']} (ranks {x['ranks']}): {x['reason']}", flush=True)
            self.publish()
            if self.deadline is None:
                self.deadline = time.monotonic() + max(self.grace_s, 5.0)

    def all_ended(self) -> bool:
        return len(self.reports) + len([x for x in self.lost if x["node"] not in self.reports]) >= self.nnodes


def serve(port: int, nnodes: int, grace_s: float, timeout_s: float, lost_after_s: float, poll_s: float = 0.5,
          join_timeout_s: float = JOIN_TIMEOUT_S) -> int:
    """Host the store until every node reported or was lost (or grace/timeout ran out); returns the exit status."""
    import torch.distributed as dist  # inside the image only

    # The store's own client connects by this host's name, not 0.0.0.0: torch looks up the
    # connect address's name first, and Docker's DNS forwards the lookup of 0.0.0.0 or
    # 127.0.0.1 upstream, which takes 10 s where the upstream does not answer (it listens on
    # all interfaces either way).
    store = dist.TCPStore(socket.gethostname(), port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    print(f"rendezvous: TCPStore on 0.0.0.0:{port}, waiting for {nnodes} node(s) to finish "
          f"(lost after {lost_after_s:g}s without heartbeat, join timeout {join_timeout_s:g}s)", flush=True)
    job = Nodes(store, nnodes, grace_s, lost_after_s, join_timeout_s)
    last_loop = time.monotonic()
    while True:
        now = time.monotonic()
        if now - last_loop > max(lost_after_s / 2, 2.0):  # this process itself stalled: silence proves nothing
            print(f"rendezvous: stalled for {now - last_loop:.0f}s; restarting the heartbeat clocks", flush=True)
            job.restart_clocks(now)
        last_loop = now
        job.listen(now)
        job.collect()
        job.find_lost(now)
        if job.all_ended():
            break
        now = time.monotonic()
        if job.deadline is not None and now > job.deadline:
            print("rendezvous: grace period over; closing the store", flush=True)
            break
        if timeout_s > 0 and now - job.start > timeout_s:
            print(f"rendezvous: --timeout-s {timeout_s:g} reached; closing the store", flush=True)
            break
        time.sleep(poll_s)
    return finish(job, poll_s)


def finish(job: Nodes, poll_s: float) -> int:
    """FINISHED set, the summary printed, the nodes still heard waited for to close their clients; the exit status."""
    job.store.set(FINISHED, "1")
    lines, status = summary(job.reports, job.nnodes, job.lost)
    print(f"rendezvous: summary after {time.monotonic() - job.start:.1f}s", flush=True)
    print("\n".join(lines), flush=True)
    if job.lost:
        print(f"rendezvous: FAILED: {verdict_message(job.lost)}", flush=True)
    else:
        print("rendezvous: " + ("all nodes exited 0" if status == 0 else "FAILED"), flush=True)
    heard = {n["k"] for n in job.nodes if n["seen"] is not None} - {x["node_rank"] for x in job.lost}
    waiting = sorted(r["node_rank"] for r in job.reports.values() if r.get("waits") and r.get("node_rank") in heard)
    await_closed(job.store, waiting, CLOSE_WAIT_S, poll_s=min(poll_s, 0.1))
    return status


def await_closed(store, node_ranks: list[int], timeout_s: float, poll_s: float = 0.1) -> list[int]:
    """Wait until each of node_ranks has set its CLOSED_KEY (its heartbeat read FINISHED and closed
    its store client), at most timeout_s; print and return those that did not."""
    t0, left = time.monotonic(), list(node_ranks)
    while left:
        left = [k for k in left if not store.check([CLOSED_KEY + str(k)])]
        if not left or time.monotonic() - t0 > timeout_s:
            break
        time.sleep(poll_s)
    if left:
        print(f"rendezvous: node rank(s) {', '.join(map(str, left))} did not close their store client within "
              f"{timeout_s:g}s; exiting anyway", flush=True)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.container.rendezvous", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=29400, help="TCP port of the store (default 29400)")
    parser.add_argument("--nnodes", type=int, required=True, help="node wrappers that will report an exit code")
    parser.add_argument("--grace-s", type=float, default=GRACE_S,
                        help=f"seconds the other nodes get to report after one failed (default {GRACE_S:g})")
    parser.add_argument("--timeout-s", type=float, default=0.0,
                        help="give up after this many seconds in all (default 0: never)")
    parser.add_argument("--lost-after-s", type=float, required=True,
                        help="a node silent this long is lost (the launcher passes layout.LOST_FRACTION x the job's timeout)")
    parser.add_argument("--join-timeout-s", type=float, default=JOIN_TIMEOUT_S,
                        help=f"a node not registered this long after the start is lost (default {JOIN_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    if args.nnodes < 1:
        parser.error("--nnodes must be >= 1")
    # PID 1 in a container ignores SIGTERM unless handled: make `docker stop` immediate.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return serve(args.port, args.nnodes, args.grace_s, args.timeout_s, lost_after_s=args.lost_after_s,
                 join_timeout_s=args.join_timeout_s)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not sys.exit: torch's teardown would keep the container up ~0.5 s after the store closed
