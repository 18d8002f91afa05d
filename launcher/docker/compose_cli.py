"""The Docker CLIs that have no SDK: Compose (v2 ``docker compose`` or v1 ``docker-compose``) and ``docker stack``.

    python -c "from simcluster.launcher.docker.compose_cli import compose_cli; print(compose_cli())"
    SIMCLUSTER_COMPOSE=docker-compose python -m launcher status    # choose compose v1

The only module that runs ``docker compose`` and ``docker stack`` (tests/test_launcher_edge.py
test_docker_through_the_sdk_only); everything else of Docker goes through the SDK (client.py).
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess

from simcluster.launcher.docker.client import Client, LauncherError


@functools.lru_cache(maxsize=None)
def compose_cli() -> tuple[str, ...]:
    """The compose command: $SIMCLUSTER_COMPOSE (e.g. ``docker-compose`` for v1), else
    ``docker compose`` (v2) if it answers, else ``docker-compose`` (v1).

    Raises:
        LauncherError: neither is installed.
    """
    if os.environ.get("SIMCLUSTER_COMPOSE"):
        return tuple(shlex.split(os.environ["SIMCLUSTER_COMPOSE"]))
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    raise LauncherError("no compose found: install the Docker Compose v2 plugin (bash .ci/docker-up.sh does) "
                        "or docker-compose v1")


def compose(project: str, file: str, *args: str, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run ``<compose> -p PROJECT -f FILE ARGS...`` (output goes to the terminal unless captured).

    Raises:
        LauncherError: check is set and compose exited non-zero.
    """
    cmd = [*compose_cli(), "-p", project, "-f", file, *args]
    proc = subprocess.run(cmd, **kwargs)
    if check and proc.returncode != 0:
        said = proc.stderr.decode("utf-8", "replace").strip() if isinstance(proc.stderr, bytes) else ""
        raise LauncherError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}" + (f": {said}" if said else ""))
    return proc


def stack_cli(client: Client, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``docker stack ARGS...`` (deploy, rm: the SDK has no stack API) against client's daemon (rehearsal
    hosts: host-0's, through DOCKER_HOST: Client.cli_env()), output captured.

    Raises:
        LauncherError: check is set and it exited non-zero (its output in the message).
    """
    cmd = ["docker", "stack", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=client.cli_env())
    if check and proc.returncode != 0:
        raise LauncherError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc
