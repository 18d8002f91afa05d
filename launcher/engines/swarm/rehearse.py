"""``launcher up --target swarm --hosts N``: the stack on N rehearsal hosts, then everything taken down.

    python -m launcher up --target swarm --hosts 2 --mesh 2x1x1 --model tiny --steps 3 [--keep]

The image is made here first (run.prepare_image: the trainer image, --requirements' derived one),
then hosts.py brings up the hosts, and their Docker client (launcher/docker/client.py Client(hosts): the
SDK at host-0's daemon, the manager, and at every host's for their task containers; the docker CLI
through DOCKER_HOST) is handed to run.py, which deploys, follows and summarises as on one daemon, with the stack
naming the registry's image and each node pinned to its host (render.py's placement constraints).
--max-restarts N restarts the job on the hosts still answering, resumed from its last checkpoint (a
lost host's nodes placed on the others). At the end, success or not: the stack removed, the hosts
removed (--keep: both left for ``status``, ``logs`` and ``down``).
A refusal (ConfigError: kept hosts that do not fit, the daemon) leaves no run folder that this `up` made.
``attach`` gives a later command (status, logs, down, chaos) the Docker client of a run's hosts, from
RUN_DIR/hosts.json.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time

from simcluster.launcher.docker.hosts import host_containers
from simcluster.launcher.docker.client import Client, LauncherError
from simcluster.launcher.engines.base import UpOptions
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.engines.swarm import hosts as rehearsal
from simcluster.launcher.engines.swarm import run
from simcluster.launcher.job.files import host_abspath
from simcluster.launcher.job.launch import Launch, restart_launch
from simcluster.core.errors import ConfigError


def _show(text: str) -> None:
    print(text, flush=True)


def up(launch: Launch, command: str, opts: UpOptions) -> int:
    """Hosts up, the job run on them (run.up), hosts down; returns the exit code of the last attempt.

    --max-restarts N: after a failed attempt the job starts again (the trainer with --resume auto: the
    newest complete checkpoint in the shared run folder) up to N times, its nodes placed on the hosts
    still answering (a lost host's nodes move to the others), saying where each node moves.

    Raises:
        ConfigError: see run.up and hosts.bring_up.
        LauncherError: an engine, the swarm, the registry or a task failed (the hosts are removed first).
    """
    t0 = time.monotonic()
    launch = run.prepare_image(launch)
    folder = host_abspath(launch.run_dir)
    made = not os.path.lexists(folder)
    try:
        return _up(launch, command, opts, t0)
    except ConfigError:  # refused before the job ran (kept hosts that do not fit, the engine): no folder left
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def _up(launch: Launch, command: str, opts: UpOptions, t0: float) -> int:
    """up's body, once the image is made."""
    reh = rehearsal.bring_up(launch, _show)
    once = dataclasses.replace(opts, max_restarts=0)
    client = Client(reh.hosts)
    try:
        attempt_launch = hosted = dataclasses.replace(launch, node=dataclasses.replace(
            launch.node, image=rehearsal.hosted_image(launch.node.image)))
        for attempt in range(opts.max_restarts + 1):
            if attempt:
                attempt_launch = _relocated(client, hosted, attempt_launch, attempt, opts.max_restarts, t0)
            code = run.up(attempt_launch, command, once, client)
            timed_out = opts.wall_timeout_s is not None and time.monotonic() - t0 >= opts.wall_timeout_s
            if code in (0, 130) or timed_out or attempt == opts.max_restarts:
                return code
            if opts.keep:  # --keep leaves the last attempt's stack, not this one's
                run.remove_stack(client, Handle.for_stack(launch.run_dir).project)
        return code
    finally:
        if opts.keep:
            _show(f"launcher: hosts {', '.join(reh.names)} kept (--keep); take them down with python -m launcher "
                  f"down --run-dir {launch.run_dir}")
        else:
            rehearsal.take_down(_show)


def _relocated(client: Client, hosted: Launch, before: Launch, attempt: int, most: int, t0: float) -> Launch:
    """Restart number attempt's launch: resumed (job/launch.py restart_launch), its nodes on the hosts
    that still answer; prints where each node ran and where it runs now.

    Raises:
        LauncherError: no host answers.
    """
    silent = set(client.silent_hosts())
    alive = tuple(name for name in client.names if name not in silent)
    if not alive:
        raise LauncherError("restart: no rehearsal host answers; nothing left to run on")
    after = dataclasses.replace(restart_launch(hosted, attempt), hosts_up=alive)
    moves = [f"{n} {a} -> {b}" for n, a, b in zip(after.names, before.node_hosts, after.node_hosts) if a != b]
    _show(f"launcher: restart {attempt}/{most} after {time.monotonic() - t0:.1f}s on hosts {', '.join(alive)}"
          + (f" ({', '.join(sorted(silent))} lost)" if silent else "") + "; " + ("; ".join(moves) if moves else
                                                                               "every node on its host")
          + ("; the trainer resumes with --resume auto" if after.train is not None else ""))
    return after


def attach(run_dir: str) -> Client | None:
    """The Docker client of run_dir's rehearsal hosts still up, or None when the run had none.

    Raises:
        ConfigError: the run had hosts and none of them is up (they are removed when `up` ends without --keep).
    """
    reh = rehearsal.read(run_dir)
    if reh is None:
        return None
    up = host_containers()
    if not up:
        raise ConfigError(f"{run_dir}: its rehearsal hosts ({', '.join(reh.names)}) are gone (`up` removes them "
                          f"when it ends; keep them with --keep)")
    return Client(tuple(h for h in reh.hosts if h[0] in up))
