"""The contract every engine's runner keeps, and the skeleton they share: follow, summarise, exit code.

    python -m launcher up --mesh 2x2x2 --model tiny --steps 3 [--target compose|swarm|slurm]

A ``Runner`` (one class per engine, as torchx's Scheduler) does, for one Launch:
  ``check(launch, opts)``  refuse what this engine cannot do, before anything starts (ConfigError);
  ``up(launch, command, opts)``  start the cluster, follow it, summarise it, take it down; the exit
      code: 0 every node exited 0, 1 the run failed, 130 interrupted.
``follow_and_summarise`` is the one skeleton of following: every container's log through
observe/follow.py's Stream and Watch (progress, lost nodes, the kill of what outlives the rendezvous),
then the one summary of observe/summary.py. ``UpOptions`` holds the flags of ``up`` itself.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from simcluster.launcher.engines import docker as engine
from simcluster.launcher.engines.handle import Handle
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.observe.follow import Stream, Watch
from simcluster.train.rundir import CLUSTER_LOG
from simcluster.launcher.observe.summary import summarise
from simcluster.train.errors import ConfigError


@dataclass(frozen=True)
class UpOptions:
    """What ``launcher up`` adds to a Launch: build (rebuild the image), keep (leave the stopped
    containers), quiet (progress lines instead of step lines), progress_every (s), max_restarts
    (whole-cluster restarts after a failure), start_late (node -> seconds after the others),
    wall_timeout_s (the whole `up`, restarts included, is killed and fails after S seconds; None:
    no limit)."""

    build: bool = False
    keep: bool = False
    quiet: bool = False
    progress_every: float = 10.0
    max_restarts: int = 0
    start_late: dict = field(default_factory=dict)
    wall_timeout_s: float | None = None

    def deadline(self, t0: float) -> tuple[float, float] | None:
        """(the time.monotonic() by which `up`, started at t0, must end, wall_timeout_s), or None."""
        return None if self.wall_timeout_s is None else (t0 + self.wall_timeout_s, self.wall_timeout_s)


class Runner:
    """One engine's way of running a Launch here (see the module docstring).

    unsupported: the UpOptions fields this engine cannot honour -> what to do instead; check()
    refuses each one given."""

    name = ""
    unsupported: dict[str, str] = {}

    def check(self, launch: Launch, opts: UpOptions) -> None:
        """Raise ConfigError, naming the option and the fix, for what this engine cannot run.

        Raises:
            ConfigError: an option of ``unsupported`` given, each with why.
        """
        given = [k for k in self.unsupported if getattr(opts, k) not in (False, 0, {}, None)]
        if given:
            raise ConfigError("\n  ".join([f"--target {self.name}:", *(f"--{k.replace('_', '-')}: "
                                                                       f"{self.unsupported[k]}" for k in given)]))

    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """Start, follow, summarise, take down; returns the exit code (0, 1, 130)."""
        raise NotImplementedError


def open_stream(launch: Launch, run_dir: str, opts: UpOptions) -> Stream:
    """The follower of one attempt: lines shown and appended to RUN_DIR/cluster.log."""
    return Stream(launch, os.path.join(run_dir, CLUSTER_LOG), opts.quiet, opts.progress_every)


def follow_and_summarise(stream: Stream, launch: Launch, handle: Handle, found: dict, run_dir: str, since: float,
                         t0: float, start_late: dict | None = None,
                         deadline: tuple[float, float] | None = None) -> tuple[int, dict]:
    """Follow the containers found (service -> container) until all ended, then summarise.

    since: UNIX time the containers were started (an older metrics.jsonl is a previous run's);
    t0: time.monotonic() of the command's start; deadline: UpOptions.deadline's, past which every
    container is killed (the run times out). Returns (0 or 1, service -> exit code).
    """
    watch = Watch(handle, start_late or {}, run_dir, since, launch.instruments.total_steps, deadline)
    try:
        stream.follow(found, watch)
    finally:
        watch.close()
    codes = {s: engine.exit_code(c) for s, c in engine.containers(handle.project, stack=handle.stack).items()}
    return (0 if summarise(stream, launch, run_dir, codes, time.monotonic() - t0, since) else 1), codes


def kill_all(handle: Handle) -> None:
    """Kill every container of the handle at once (Ctrl-C ends everything within seconds)."""
    for c in engine.containers(handle.project, stack=handle.stack).values():
        engine.kill(c)
