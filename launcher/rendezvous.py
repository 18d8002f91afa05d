"""Rendezvous service: the cluster's TCPStore, which also collects each node's exit code.

    python -m launcher.rendezvous --port 29400 --nnodes 2 [--grace-s 30] [--timeout-s 0]

Hosts torch.distributed.TCPStore on 0.0.0.0:PORT (torchrun's c10d rendezvous and the
workers' process-group bootstrap use it). Each node wrapper (launcher/node.py) reports its
exit code when its torchrun ends; once all NNODES reported, this prints one line per node
(name, ranks, exit code) and exits 0 only if every node exited 0 -- which is what lets a
plain ``docker compose up`` end by itself. After a node reports failure, the others get
GRACE_S seconds to report before this exits 1 (closing the store, which ends them too).

Store protocol (shared with launcher/node.py):
    simcluster/reported        counter, incremented by each reporting node
    simcluster/reported/<i>    node name of the i-th report (i = 1, 2, ...)
    simcluster/exit/<node>     JSON {"node", "node_rank", "ranks", "exit_code"}
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from datetime import timedelta

REPORTED = "simcluster/reported"
EXIT_KEY = "simcluster/exit/"


def report_key(index: int) -> str:
    """Store key holding the node name of the index-th report (1-based)."""
    return f"{REPORTED}/{index}"


def summary(reports: dict[str, dict], nnodes: int) -> tuple[list[str], int]:
    """Summary lines (one per node, sorted by name) and the exit status: 0 iff all nnodes
    nodes reported exit code 0, else 1."""
    lines = [f"  {name:<10} ranks {r.get('ranks', '?'):<9} exit {r.get('exit_code')}" for name, r in sorted(reports.items())]
    missing = nnodes - len(reports)
    if missing > 0:
        lines.append(f"  {missing} node(s) never reported (container killed or never started)")
    ok = missing <= 0 and all(r.get("exit_code") == 0 for r in reports.values())
    return lines, 0 if ok else 1


def serve(port: int, nnodes: int, grace_s: float, timeout_s: float, poll_s: float = 0.5) -> int:
    """Host the store until every node reported (or grace/timeout ran out); returns the exit status."""
    import torch.distributed as dist  # inside the image only

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    print(f"rendezvous: TCPStore on 0.0.0.0:{port}, waiting for {nnodes} node(s) to finish", flush=True)
    start = time.monotonic()
    reports: dict[str, dict] = {}
    seen = 0
    deadline = None
    while True:
        count = store.add(REPORTED, 0)
        while seen < count:
            seen += 1
            name = store.get(report_key(seen)).decode()
            report = json.loads(store.get(EXIT_KEY + name).decode())
            reports[name] = report
            print(f"rendezvous: {name} (ranks {report.get('ranks')}) exited {report.get('exit_code')}", flush=True)
            if report.get("exit_code") != 0 and deadline is None:
                deadline = time.monotonic() + grace_s
                print(f"rendezvous: {name} failed; waiting up to {grace_s:g}s for the other nodes", flush=True)
        if len(reports) >= nnodes:
            break
        now = time.monotonic()
        if deadline is not None and now > deadline:
            print("rendezvous: grace period over; closing the store", flush=True)
            break
        if timeout_s > 0 and now - start > timeout_s:
            print(f"rendezvous: --timeout-s {timeout_s:g} reached; closing the store", flush=True)
            break
        time.sleep(poll_s)
    lines, status = summary(reports, nnodes)
    print(f"rendezvous: summary after {time.monotonic() - start:.1f}s", flush=True)
    print("\n".join(lines), flush=True)
    print("rendezvous: " + ("all nodes exited 0" if status == 0 else "FAILED"), flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.rendezvous", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=29400, help="TCP port of the store (default 29400)")
    parser.add_argument("--nnodes", type=int, required=True, help="node wrappers that will report an exit code")
    parser.add_argument("--grace-s", type=float, default=30.0,
                        help="seconds the other nodes get to report after one failed (default 30)")
    parser.add_argument("--timeout-s", type=float, default=0.0,
                        help="give up after this many seconds in all (default 0: never)")
    args = parser.parse_args(argv)
    if args.nnodes < 1:
        parser.error("--nnodes must be >= 1")
    # PID 1 in a container ignores SIGTERM unless handled: make `docker stop` immediate.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return serve(args.port, args.nnodes, args.grace_s, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
