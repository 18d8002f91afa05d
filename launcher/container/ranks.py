"""The rank processes under a node's torchrun, seen through /proc (Linux): which is which, which are frozen.

    python -m launcher.container.ranks                     # list: rank, pid, state (inside a node container)
    python -m launcher.container.ranks --signal STOP --rank 5   # freeze rank 5 (what `launcher chaos --freeze` runs)

A rank frozen by SIGSTOP (or a cgroup freeze of its process) still looks alive to its node's
heartbeat thread and to torchrun's agent, which only polls exit codes. The node wrapper
(launcher/container/node.py) asks ``frozen`` every second, so liveness reaches the ranks.
A rank's number comes from its environment (RANK, set when stock torchrun starts it); ranks
forked by train/forkrun.py inherit the agent's environment, so for them it is the
node's first rank plus their index among their fork server's children in start (pid) order (the
server is the agent's child beside multiprocessing's resource tracker: the one with children).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys


def _table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process this one can see."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
            out[int(entry)] = (int(rest[1]), rest[0])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _env_rank(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"RANK="):
                    return int(item[5:])
    except (OSError, ValueError):
        pass
    return None


def rank_processes(root: int, first_rank: int) -> dict[int, tuple[int, str]]:
    """rank -> (pid, state) of the rank processes under root (the node's torchrun): the
    descendants that carry RANK in their environment, else the children of the process whose
    children are all leaves (forkrun's fork server), numbered from first_rank in pid order. State is /proc's
    letter: R running, S sleeping, T stopped, ..."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    ranks: dict[int, tuple[int, str]] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        kids = sorted(children.get(parent, []))
        for i, pid in enumerate(kids):
            rank = _env_rank(pid)
            if rank is not None and rank not in ranks:
                ranks[rank] = (pid, table[pid][1])
            todo.append(pid)
        if kids and not any(_env_rank(p) is not None for p in kids) and not any(children.get(p) for p in kids):
            # forked ranks: the fork server's children (leaves, without RANK of their own), in start order
            for i, pid in enumerate(kids):
                ranks.setdefault(first_rank + i, (pid, table[pid][1]))
    return ranks


def frozen(root: int, first_rank: int) -> dict[int, int]:
    """rank -> pid of the rank processes under root that are stopped (state T)."""
    return {rank: pid for rank, (pid, state) in rank_processes(root, first_rank).items() if state in ("T", "t")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.container.ranks", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=int, default=1, help="the node wrapper's pid (1 in a node container)")
    p.add_argument("--first-rank", type=int, default=int(os.environ.get("SIMCLUSTER_NODE", 0)) *
                   int(os.environ.get("SIMCLUSTER_NPROC_PER_NODE", 1)), help="the node's first global rank")
    p.add_argument("--rank", type=int, default=None, help="act on this global rank only")
    p.add_argument("--signal", default=None, help="send this signal (STOP, CONT, KILL, ...) to the rank(s)")
    args = p.parse_args(argv)
    found = {r: v for r, v in rank_processes(args.root, args.first_rank).items() if args.rank in (None, r)}
    if not found:
        print(f"no rank process{f' of rank {args.rank}' if args.rank is not None else ''} under pid {args.root}",
              file=sys.stderr)
        return 1
    for rank, (pid, state) in sorted(found.items()):
        if args.signal:
            os.kill(pid, getattr(signal, "SIG" + args.signal.upper().removeprefix("SIG")))
        print(f"rank={rank} pid={pid} state={state}" + (f" sent SIG{args.signal.upper().removeprefix('SIG')}"
                                                          if args.signal else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
