"""The skeleton every engine's ``up`` shares: follow every container, summarise, kill on Ctrl-C.

    python -m launcher up --mesh 2x2x2 --model tiny --steps 3 [--target compose|swarm|slurm]

``follow_and_summarise`` is the one skeleton of following: every container's log through
observe/follow.py's Stream and Watch (progress, lost nodes, the kill of what outlives the rendezvous),
then the one summary of observe/summary.py. ``open_stream`` opens an attempt's follower,
``kill_all`` kills a handle's containers at once. The contract of an engine is base.py's.
"""
from __future__ import annotations

import os
import time

from simcluster.launcher.docker.client import Client
from simcluster.launcher.docker.container import kill
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.engines.base import UpOptions
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.observe.follow import Stream, Watch
from simcluster.core.runlog import CLUSTER_LOG
from simcluster.launcher.observe.summary import summarise
from simcluster.core.hang import EXIT_HANG, read_hang


def open_stream(launch: Launch, run_dir: str, opts: UpOptions) -> Stream:
    """The follower of one attempt: lines shown and appended to RUN_DIR/cluster.log."""
    return Stream(launch, os.path.join(run_dir, CLUSTER_LOG), opts.quiet, opts.progress_every, opts.metric_regex)


def follow_and_summarise(client: Client, stream: Stream, launch: Launch, handle: Handle, found: dict, run_dir: str,
                         since: float, t0: float, opts: UpOptions) -> tuple[int, dict]:
    """Follow the containers found (service -> container, of client's daemons) until all ended, then summarise.

    since: UNIX time the containers were started (an older metrics.jsonl is a previous run's);
    t0: time.monotonic() of the command's start; opts: `up`'s options, which the Watch reads (late
    starts, the wall-clock deadline past which every container is killed). Returns (0, 1, or
    EXIT_HANG (4) after a stall; service -> exit code).
    """
    stream.placed = {s: h for s, c in found.items() if (h := client.host_of(c))}  # up --hosts
    watch = Watch(client, handle, run_dir, since, launch.instruments.total_steps, opts, t0)
    try:
        stream.follow(found, watch)
    finally:
        watch.close()
    codes = {s: client.exit_code(c) for s, c in client.containers(handle.project, stack=handle.stack).items()}
    ok = summarise(stream, launch, run_dir, codes, time.monotonic() - t0, since)
    return (0 if ok else EXIT_HANG if read_hang(run_dir, since) else 1), codes


def kill_all(client: Client, handle: Handle) -> None:
    """Kill every container of the handle at once (Ctrl-C ends everything within seconds)."""
    for c in client.containers(handle.project, stack=handle.stack).values():
        kill(c)
