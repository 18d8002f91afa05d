"""What is done to one container, through the Docker SDK: exec, wait, kill, stop, pause, remove, disconnect, logs.

    python -c "from simcluster.launcher.docker.client import Client; from simcluster.launcher.docker.container import log_text; print([log_text(c, 1) for c in Client().containers('simcluster').values()])"

A container carries the SDK client of its own daemon, so none of these needs a Client; the
containers come from one (client.py: ``Client.containers``). Each raises LauncherError with the
daemon's explanation.
"""
from __future__ import annotations

import time

from simcluster.launcher.docker.client import LauncherError, sdk_errors


def exec_in(container, cmd: list[str], user: str = "", workdir: str | None = None) -> tuple[int, str]:
    """``docker exec`` cmd in a running container (user "": the container's own); returns (exit code, stdout and
    stderr as text). Raises LauncherError: the container is not running, is gone, or the daemon refused."""
    with sdk_errors(f"`docker exec {container.name} {cmd[0]}`"):
        rc, out = container.exec_run(cmd, user=user, workdir=workdir)
        return rc, out.decode("utf-8", "replace")


def wait(container, timeout_s: float) -> int:
    """Wait until the container exits; its exit code. Raises LauncherError: timeout_s passed, the container is gone,
    or the daemon failed."""
    with sdk_errors(f"waiting for {container.name}"):
        return container.wait(timeout=timeout_s)["StatusCode"]


def kill(container, strict: bool = False) -> None:
    """Kill a container, unpausing it first (a paused one cannot be stopped); gone is fine. Raises LauncherError:
    only when strict (chaos): the daemon refused, e.g. it is not running."""
    try:
        with sdk_errors(f"`docker kill {container.name}`", missing_ok=True):
            container.reload()
            if container.status == "paused":
                container.unpause()
            container.kill()
    except LauncherError:
        if strict:
            raise


def stop(container, timeout_s: float) -> None:
    """``docker stop``: SIGTERM, then SIGKILL after timeout_s. Raises LauncherError: the daemon refused or the
    container is gone."""
    with sdk_errors(f"`docker stop {container.name}`"):
        container.stop(timeout=timeout_s)


def pause(container, attempts: int = 5) -> None:
    """``docker pause`` (freeze every process), retried: runc's freeze can fail transiently ("unable to freeze")
    while a process forks. Raises LauncherError: the last attempt was refused, or the container is gone."""
    for attempt in range(attempts):
        try:
            with sdk_errors(f"`docker pause {container.name}`"):
                return container.pause()
        except LauncherError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.3)


def unpause(container) -> None:
    """``docker unpause`` a paused container; gone is fine. Raises LauncherError: the daemon refused, e.g. it is not
    paused."""
    with sdk_errors(f"`docker unpause {container.name}`", missing_ok=True):
        container.unpause()


def remove(container) -> None:
    """``docker rm -f``: remove a container, killing it if it runs; gone is fine. Raises LauncherError: the daemon
    refused (e.g. a removal already in progress)."""
    with sdk_errors(f"`docker rm -f {container.name}`", missing_ok=True):
        container.remove(force=True)


def disconnect(container) -> list[str]:
    """Disconnect a container from every network it is on; returns their names. Raises LauncherError: the container
    or a network is gone, or the daemon refused."""
    with sdk_errors(f"`docker network disconnect` of {container.name}"):
        container.reload()
        nets = sorted((container.attrs.get("NetworkSettings") or {}).get("Networks") or {})
        for net in nets:
            container.client.networks.get(net).disconnect(container, force=True)
        return nets


def log_text(container, tail: int | str = "all") -> str:
    """The container's log so far (stdout and stderr; its last ``tail`` lines) as text; "" when the container is
    gone. Raises LauncherError: the daemon failed."""
    with sdk_errors(f"`docker logs {container.name}`", missing_ok=True):
        return container.logs(tail=tail).decode("utf-8", "replace")
    return ""


def log_lines(container, timestamps: bool = False):
    """The container's log from the start, following, as text lines (stdout and stderr); with
    timestamps, each line starts with the time the container wrote it (RFC 3339, nanoseconds, UTC)
    and a space, Docker's own stamp (``log_time`` reads it)."""
    buf = b""
    for chunk in container.logs(stream=True, follow=True, timestamps=timestamps):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")


def log_time(line: str) -> tuple[float | None, str]:
    """(UNIX time, text) of a line of ``log_lines(..., timestamps=True)``; (None, line) when it has no stamp."""
    import datetime

    stamp, _, text = line.partition(" ")
    day, _, frac = stamp.rstrip("Z").partition(".")
    try:
        t = datetime.datetime.fromisoformat(day).replace(tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None, line
    return t + float(f"0.{frac or 0}"), text
