"""``launcher up --target swarm --hosts N``: the stack on N rehearsal hosts, then everything taken down.

    python -m launcher up --target swarm --hosts 2 --mesh 2x1x1 --model tiny --steps 3 [--keep]

The image is made here first (run.prepare_image: the trainer image, --requirements' derived one),
then hosts.py brings up the hosts, and the launcher is directed at them (docker.use_hosts: the SDK
at host-0's engine, the manager, and at every host's for their task containers; the docker CLI
through DOCKER_HOST), so run.py deploys, follows and summarises as on one engine, with the stack
naming the registry's image and each node pinned to its host (render.py's placement constraints).
At the end, success or not: the stack removed, the hosts removed (--keep: both left for
``status``, ``logs`` and ``down``), and the launcher back on this machine's engine.
``attach`` directs a later command (status, logs, down, chaos) at a run's hosts from RUN_DIR/hosts.json.
"""
from __future__ import annotations

import dataclasses
import sys

from simcluster.launcher.engines import docker as engine
from simcluster.launcher.engines import docker_hosts
from simcluster.launcher.engines.base import UpOptions
from simcluster.launcher.engines.swarm import hosts as rehearsal
from simcluster.launcher.engines.swarm import run
from simcluster.launcher.job.launch import Launch
from simcluster.train.errors import ConfigError


def _show(text: str) -> None:
    print(text, flush=True)


def up(launch: Launch, command: str, opts: UpOptions) -> int:
    """Hosts up, the job run on them (run.up), hosts down; returns the exit code.

    Raises:
        ConfigError: see run.up and hosts.bring_up.
        LauncherError: an engine, the swarm, the registry or a task failed (the hosts are removed first).
    """
    launch = run.prepare_image(launch)
    reh = rehearsal.bring_up(launch, _show)
    try:
        engine.use_hosts(list(reh.hosts))
        hosted = dataclasses.replace(launch, node=dataclasses.replace(launch.node,
                                                                      image=rehearsal.hosted_image(launch.node.image)))
        return run.up(hosted, command, opts, hosted=True)
    finally:
        engine.use_hosts([])
        if opts.keep:
            print(f"launcher: hosts {', '.join(reh.names)} kept (--keep); take them down with python -m launcher "
                  f"down --run-dir {launch.run_dir}", file=sys.stderr, flush=True)
        else:
            rehearsal.take_down(reh.run_dir, _show)


def attach(run_dir: str) -> bool:
    """Direct the launcher at the hosts of run_dir's rehearsal when it had any; whether it did.

    Raises:
        ConfigError: the run had hosts and none of them is up (they are removed when `up` ends without --keep).
    """
    reh = rehearsal.read(run_dir)
    if reh is None:
        return False
    up = docker_hosts.host_containers()
    if not up:
        raise ConfigError(f"{run_dir}: its rehearsal hosts ({', '.join(reh.names)}) are gone (`up` removes them "
                          f"when it ends; keep them with --keep)")
    engine.use_hosts([h for h in reh.hosts if h[0] in up])
    return True
