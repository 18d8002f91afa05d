"""The Docker engine through the Docker SDK for Python: containers, images, the engine's facts.

    python -c "from simcluster.launcher.engines.docker import info; print(info()['ServerVersion'])"

Containers are found by the labels both Compose versions set (com.docker.compose.project /
.service), so the rest of the launcher is version-agnostic; a swarm stack's task containers by
the labels the swarm sets (com.docker.stack.namespace / com.docker.swarm.service.name). The SDK
negotiates the API version with the engine (1.41 on Docker 20.10).

This module, docker_images.py (images: labels, build, the probe, one-shot runs) and docker_cluster.py
(networks, labels, the swarm and its stacks, the event stream) are the only ones that touch the SDK (``import docker``, ``client()``, every SDK object method;
tests/test_launcher_edge.py test_docker_through_the_sdk_only checks the rest): callers get small
named functions, which raise LauncherError with the engine's explanation, and treat containers as
opaque handles (``.status``, ``.labels``, ``.name``, ``.attrs`` may be read). The CLIs without an
SDK (Compose v2 or v1, ``docker stack``) are compose_cli.py's.
"""
from __future__ import annotations

import contextlib
import functools
import time

import docker
from docker.errors import DockerException, NotFound
from requests.exceptions import RequestException

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
STACK_LABEL = "com.docker.stack.namespace"  # on a stack's services, networks and task containers
TASK_SERVICE_LABEL = "com.docker.swarm.service.name"  # <stack>_<service> on a task container


class LauncherError(RuntimeError):
    """Docker or Compose failed or is missing; the message says what to do (exit code 1)."""


HOSTS: list[tuple[str, str]] = []  # (host name, engine URL) of rehearsal hosts, host-0 first: use_hosts()
HOST_TIMEOUT_S = 10.0  # a rehearsal host's engine answers within this, or counts as gone


@functools.lru_cache(maxsize=None)
def client_for(url: str | None) -> docker.DockerClient:
    """The client of the engine at url (``tcp://127.0.0.1:PORT``: a rehearsal host's, HOST_TIMEOUT_S), or of
    this machine's (None: DOCKER_HOST's); cached once it answered. Raises LauncherError: it does not answer."""
    try:
        c = docker.from_env(timeout=120) if url is None else docker.DockerClient(base_url=url, timeout=HOST_TIMEOUT_S)
        c.ping()
        return c
    except (DockerException, RequestException) as e:
        if url is not None:
            raise LauncherError(f"the engine at {url} does not answer ({e})") from None
        raise LauncherError(f"no Docker engine answers ({e}); start one: sudo bash .ci/docker-up.sh") from None


def client() -> docker.DockerClient:
    """The engine's client (API version negotiated): this machine's (DOCKER_HOST's), or host-0's while
    use_hosts() directs the launcher at rehearsal hosts (the swarm's manager).

    Raises:
        LauncherError: no engine answers.
    """
    return client_for(HOSTS[0][1] if HOSTS else None)


def outer() -> docker.DockerClient:
    """This machine's engine (DOCKER_HOST's) even while use_hosts() is in force: the one the hosts run on.

    Raises:
        LauncherError: no engine answers.
    """
    return client_for(None)


def use_hosts(hosts: list[tuple[str, str]]) -> None:
    """Direct client(), containers(), container_by_id() and the events at rehearsal hosts' engines:
    (host name, engine URL like ``tcp://127.0.0.1:32769``), host-0 (the manager) first; [] = back to
    this machine's engine. The docker CLI follows through cli_env()."""
    HOSTS[:] = list(hosts)


def cli_env() -> dict | None:
    """The environment for the docker CLI (``docker stack``): DOCKER_HOST set to host-0's engine while
    use_hosts() is in force, else None (the caller's)."""
    import os

    return {**os.environ, "DOCKER_HOST": HOSTS[0][1]} if HOSTS else None


def engines() -> list[tuple[str, docker.DockerClient]]:
    """(host name, client) of every engine that answers a ping: the rehearsal hosts' in order, or ("", this
    machine's). A host whose engine is gone (killed, cut off) is left out; docker_hosts.silent_hosts() names it."""
    if not HOSTS:
        return [("", client())]
    out = []
    for name, url in HOSTS:
        try:
            c = client_for(url)
            c.ping()
            out.append((name, c))
        except (DockerException, RequestException, LauncherError):
            pass  # a failed connect is not cached: the next call tries again
    return out


@contextlib.contextmanager
def sdk_errors(what: str, missing_ok: bool = False):
    """The SDK's errors as LauncherError("WHAT failed: <the engine's explanation>"); a missing
    object (NotFound) is skipped when missing_ok (the with block then ends early)."""
    try:
        yield
    except NotFound as e:
        if not missing_ok:
            raise LauncherError(f"{what} failed: {e.explanation or e}") from None
    except (DockerException, RequestException) as e:  # RequestException: a timeout of the engine's answer
        raise LauncherError(f"{what} failed: {getattr(e, 'explanation', None) or e}") from None


def info() -> dict:
    """The engine's ``docker info`` facts (``Swarm``: LocalNodeState, ControlAvailable, Nodes, ..). Raises
    LauncherError: no engine answers, or it failed."""
    with sdk_errors("docker info"):
        return client().info()


def stack_service(stack: str, name: str) -> str | None:
    """A swarm service's name within its stack (``<stack>_node-0`` -> ``node-0``); None if not of it."""
    return name[len(stack) + 1:] if name.startswith(stack + "_") else None


def service_of(labels: dict, project: str, stack: bool = False) -> str | None:
    """The service a container with these labels belongs to (a stack's without the ``<stack>_`` prefix)."""
    return stack_service(project, labels.get(TASK_SERVICE_LABEL) or "") if stack else labels.get(SERVICE_LABEL)


def containers(project: str, stack: bool = False) -> dict:
    """service -> Container of a compose project, or of a swarm stack when stack (all, running or
    not; a stack's newest task container of each service), on every engine that answers (each
    rehearsal host's, with use_hosts())."""
    out = {}
    for _, c in engines():
        try:
            found = c.containers.list(all=True, ignore_removed=True,
                                    filters={"label": f"{STACK_LABEL if stack else PROJECT_LABEL}={project}"})
        except (DockerException, RequestException):
            if not HOSTS:
                raise
            continue  # a host that went away while listed
        for one in reversed(found):  # listed newest first
            key = service_of(one.labels, project, stack) or one.name
            if key not in out or str(one.attrs.get("Created", "")) >= str(out[key].attrs.get("Created", "")):
                out[key] = one
    return out


def exit_code(container) -> int | None:
    """Exit code of a stopped container (None if it is gone, or its host's engine is)."""
    try:
        container.reload()
    except NotFound:
        return None
    except (DockerException, RequestException):
        if not HOSTS:
            raise
        return None
    return container.attrs["State"]["ExitCode"]


def run_in_netns(image: str, command: list[str], container) -> str:
    """Run a short-lived root container of ``image`` in ``container``'s network namespace with
    NET_ADMIN only (``network_mode="container:<id>"``), removed afterwards; returns its output.
    The node itself keeps every capability dropped.

    Raises:
        LauncherError: the helper failed (its output in the message) or the image is missing.
    """
    try:
        out = client().containers.run(image, command, remove=True, user="0:0", cap_drop=["ALL"], cap_add=["NET_ADMIN"],
                                      network_mode=f"container:{container.id}", stdout=True, stderr=True)
    except docker.errors.ContainerError as e:
        text = (e.stderr or b"").decode("utf-8", "replace").strip() if isinstance(e.stderr, bytes) else str(e.stderr)
        raise LauncherError(f"the network helper ({image}: {' '.join(command)}) failed: {text}") from None
    except docker.errors.ImageNotFound:
        raise LauncherError(f"image {image} not found; build it with bash images/build.sh") from None
    except docker.errors.APIError as e:
        raise LauncherError(f"the network helper container failed to start: {e.explanation or e}") from None
    return out.decode("utf-8", "replace")


def run_container(image: str, command: list[str], **options):
    """Start a detached container of image running command; returns it. options: the SDK's ``containers.run``
    keywords (name, hostname, network, volumes, labels, environment, user, cap_drop, security_opt, nano_cpus,
    mem_limit). Raises LauncherError: the image is missing or the engine refused."""
    with sdk_errors(f"starting a container of {image}"):
        return client().containers.run(image, command, detach=True, **options)


def container_by_id(cid: str):
    """The container with this id on any engine (each rehearsal host's with use_hosts()), or None when
    there is none. Raises LauncherError: the engine failed."""
    for _, c in engines():
        with sdk_errors(f"looking up container {cid[:12]}", missing_ok=True):
            return c.containers.get(cid)
    return None


def exec_in(container, cmd: list[str], user: str = "", workdir: str | None = None) -> tuple[int, str]:
    """``docker exec`` cmd in a running container (user "": the container's own); returns (exit code, stdout and
    stderr as text). Raises LauncherError: the container is not running, is gone, or the engine refused."""
    with sdk_errors(f"`docker exec {container.name} {cmd[0]}`"):
        rc, out = container.exec_run(cmd, user=user, workdir=workdir)
        return rc, out.decode("utf-8", "replace")


def wait(container, timeout_s: float) -> int:
    """Wait until the container exits; its exit code. Raises LauncherError: timeout_s passed, the container is gone,
    or the engine failed."""
    with sdk_errors(f"waiting for {container.name}"):
        return container.wait(timeout=timeout_s)["StatusCode"]


def kill(container, strict: bool = False) -> None:
    """Kill a container, unpausing it first (a paused one cannot be stopped); gone is fine. Raises LauncherError:
    only when strict (chaos): the engine refused, e.g. it is not running."""
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
    """``docker stop``: SIGTERM, then SIGKILL after timeout_s. Raises LauncherError: the engine refused or the
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
    """``docker unpause`` a paused container; gone is fine. Raises LauncherError: the engine refused, e.g. it is not
    paused."""
    with sdk_errors(f"`docker unpause {container.name}`", missing_ok=True):
        container.unpause()


def remove(container) -> None:
    """``docker rm -f``: remove a container, killing it if it runs; gone is fine. Raises LauncherError: the engine
    refused (e.g. a removal already in progress)."""
    with sdk_errors(f"`docker rm -f {container.name}`", missing_ok=True):
        container.remove(force=True)


def disconnect(container) -> list[str]:
    """Disconnect a container from every network it is on; returns their names. Raises LauncherError: the container
    or a network is gone, or the engine refused."""
    with sdk_errors(f"`docker network disconnect` of {container.name}"):
        container.reload()
        nets = sorted((container.attrs.get("NetworkSettings") or {}).get("Networks") or {})
        for net in nets:
            client().networks.get(net).disconnect(container, force=True)
        return nets


def log_text(container, tail: int | str = "all") -> str:
    """The container's log so far (stdout and stderr; its last ``tail`` lines) as text; "" when the container is
    gone. Raises LauncherError: the engine failed."""
    with sdk_errors(f"`docker logs {container.name}`", missing_ok=True):
        return container.logs(tail=tail).decode("utf-8", "replace")
    return ""


def log_lines(container):
    """The container's log from the start, following, as text lines (stdout and stderr)."""
    buf = b""
    for chunk in container.logs(stream=True, follow=True):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")
