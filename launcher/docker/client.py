"""The Docker client: this machine's Docker daemon, or the rehearsal hosts' daemons, through the Docker SDK.

    python -c "from simcluster.launcher.docker.client import Client; print(Client().info()['ServerVersion'])"

``Client`` is the one word for a connection to Docker: ``Client()`` reaches this machine's daemon
(DOCKER_HOST's), ``Client(hosts)`` the daemons of rehearsal hosts (``up --target swarm --hosts N``:
host-0, the swarm's manager, first). There is no process-wide switch: whoever reaches Docker is
handed a Client (an Engine's ``attach`` gives the one of a run). Containers are found by the labels
both Compose versions set (com.docker.compose.project / .service), so the rest of the launcher is
version-agnostic; a swarm stack's task containers by the labels the swarm sets
(com.docker.stack.namespace / com.docker.swarm.service.name). The SDK negotiates the API version
with the daemon (1.41 on Docker 20.10).

This folder (launcher/docker/) is the only one that touches the SDK (tests/test_launcher_edge.py
test_docker_through_the_sdk_only): client.py (the client, its errors, the containers of a project),
container.py (what is done to one container), images.py, cluster.py (networks, labels, the swarm
and its stacks, the event stream), hosts.py (rehearsal hosts); callers get small named functions
and methods, which raise LauncherError with the daemon's explanation, and treat containers as
opaque handles (``.status``, ``.labels``, ``.name``, ``.attrs`` may be read). The CLIs without an
SDK (Compose v2 or v1, ``docker stack``) are compose_cli.py's.
"""
from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import docker
from docker.errors import DockerException, NotFound
from requests.exceptions import RequestException

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
STACK_LABEL = "com.docker.stack.namespace"  # on a stack's services, networks and task containers
TASK_SERVICE_LABEL = "com.docker.swarm.service.name"  # <stack>_<service> on a task container
HOST_TIMEOUT_S = 10.0  # a rehearsal host's daemon answers within this, or counts as gone


class LauncherError(RuntimeError):
    """Docker or Compose failed or is missing; the message says what to do (exit code 1)."""


@functools.lru_cache(maxsize=None)
def sdk_client(url: str | None) -> docker.DockerClient:
    """The SDK's client of the daemon at url (``tcp://127.0.0.1:PORT``: a rehearsal host's, HOST_TIMEOUT_S), or of
    this machine's (None: DOCKER_HOST's); cached once it answered. Raises LauncherError: it does not answer."""
    try:
        c = docker.from_env(timeout=120) if url is None else docker.DockerClient(base_url=url, timeout=HOST_TIMEOUT_S)
        c.ping()
        return c
    except (DockerException, RequestException) as e:
        if url is not None:
            raise LauncherError(f"the Docker daemon at {url} does not answer ({e})") from None
        raise LauncherError(f"no Docker engine answers ({e}); start one: sudo bash .ci/docker-up.sh") from None


@contextlib.contextmanager
def sdk_errors(what: str, missing_ok: bool = False):
    """The SDK's errors as LauncherError("WHAT failed: <the daemon's explanation>"); a missing
    object (NotFound) is skipped when missing_ok (the with block then ends early)."""
    try:
        yield
    except NotFound as e:
        if not missing_ok:
            raise LauncherError(f"{what} failed: {e.explanation or e}") from None
    except (DockerException, RequestException) as e:  # RequestException: a timeout of the daemon's answer
        raise LauncherError(f"{what} failed: {getattr(e, 'explanation', None) or e}") from None


def stack_service(stack: str, name: str) -> str | None:
    """A swarm service's name within its stack (``<stack>_node-0`` -> ``node-0``); None if not of it."""
    return name[len(stack) + 1:] if name.startswith(stack + "_") else None


def service_of(labels: dict, project: str, stack: bool = False) -> str | None:
    """The service a container with these labels belongs to (a stack's without the ``<stack>_`` prefix)."""
    return stack_service(project, labels.get(TASK_SERVICE_LABEL) or "") if stack else labels.get(SERVICE_LABEL)


@dataclass(frozen=True)
class Client:
    """A connection to Docker: this machine's daemon (hosts empty), or rehearsal hosts' daemons
    (hosts: (host name, daemon URL like ``tcp://127.0.0.1:32769``), host-0, the swarm's manager, first).
    Its SDK clients are made on first use and cached."""

    hosts: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> list[str]:
        """The rehearsal hosts' names, host-0 first ([] on this machine's daemon)."""
        return [name for name, _ in self.hosts]

    def sdk(self):
        """The SDK client of the daemon that deploys: host-0's (the manager) on rehearsal hosts, else this
        machine's. Raises LauncherError: it does not answer."""
        return sdk_client(self.hosts[0][1] if self.hosts else None)

    def sdks(self) -> list[tuple[str, object]]:
        """(host name, SDK client) of every daemon that answers a ping: the rehearsal hosts' in order, or ("",
        this machine's). A host whose daemon is gone (killed, cut off) is left out; silent_hosts() names it."""
        if not self.hosts:
            return [("", self.sdk())]
        out = []
        for name, url in self.hosts:
            try:
                c = sdk_client(url)
                c.ping()
                out.append((name, c))
            except (DockerException, RequestException, LauncherError):
                pass  # a failed connect is not cached: the next call tries again
        return out

    def cli_env(self) -> dict | None:
        """The environment for the docker CLI (``docker stack``): DOCKER_HOST set to host-0's daemon on
        rehearsal hosts, else None (the caller's)."""
        return {**os.environ, "DOCKER_HOST": self.hosts[0][1]} if self.hosts else None

    def silent_hosts(self) -> list[str]:
        """The rehearsal hosts whose daemon does not answer a ping within HOST_TIMEOUT_S (killed or cut off)."""
        silent = []
        for name, url in self.hosts:
            try:
                sdk_client(url).ping()
            except (DockerException, RequestException, LauncherError):
                silent.append(name)
        return silent

    def host_of(self, container) -> str:
        """The rehearsal host whose daemon holds container ("" on this machine's daemon)."""
        url = getattr(container.client.api, "base_url", "")
        return next((name for name, u in self.hosts if u.replace("tcp://", "http://") == url), "")

    def info(self) -> dict:
        """The daemon's ``docker info`` facts (``Swarm``: LocalNodeState, ControlAvailable, Nodes, ..). Raises
        LauncherError: no daemon answers, or it failed."""
        with sdk_errors("docker info"):
            return self.sdk().info()

    def containers(self, project: str, stack: bool = False) -> dict:
        """service -> Container of a compose project, or of a swarm stack when stack (all, running or
        not; a stack's newest task container of each service), on every daemon that answers (each
        rehearsal host's)."""
        out = {}
        for _, c in self.sdks():
            try:
                found = c.containers.list(all=True, ignore_removed=True,
                                          filters={"label": f"{STACK_LABEL if stack else PROJECT_LABEL}={project}"})
            except (DockerException, RequestException):
                if not self.hosts:
                    raise
                continue  # a host that went away while listed
            for one in reversed(found):  # listed newest first
                key = service_of(one.labels, project, stack) or one.name
                if key not in out or str(one.attrs.get("Created", "")) >= str(out[key].attrs.get("Created", "")):
                    out[key] = one
        return out

    def exit_code(self, container) -> int | None:
        """Exit code of a stopped container (None if it is gone, or its host's daemon is)."""
        try:
            container.reload()
        except NotFound:
            return None
        except (DockerException, RequestException):
            if not self.hosts:
                raise
            return None
        return container.attrs["State"]["ExitCode"]

    def container_by_id(self, cid: str):
        """The container with this id on any daemon (each rehearsal host's), or None when there is none.
        Raises LauncherError: the daemon failed."""
        for _, c in self.sdks():
            with sdk_errors(f"looking up container {cid[:12]}", missing_ok=True):
                return c.containers.get(cid)
        return None

    def run_container(self, image: str, command: list[str], **options):
        """Start a detached container of image running command; returns it. options: the SDK's ``containers.run``
        keywords (name, hostname, network, volumes, labels, environment, user, cap_drop, security_opt, nano_cpus,
        mem_limit). Raises LauncherError: the image is missing or the daemon refused."""
        with sdk_errors(f"starting a container of {image}"):
            return self.sdk().containers.run(image, command, detach=True, **options)

    def run_in_netns(self, image: str, command: list[str], container) -> str:
        """Run a short-lived root container of ``image`` in ``container``'s network namespace with
        NET_ADMIN only (``network_mode="container:<id>"``), removed afterwards; returns its output.
        The node itself keeps every capability dropped.

        Raises:
            LauncherError: the helper failed (its output in the message) or the image is missing.
        """
        try:
            out = self.sdk().containers.run(image, command, remove=True, user="0:0", cap_drop=["ALL"],
                                            cap_add=["NET_ADMIN"], network_mode=f"container:{container.id}",
                                            stdout=True, stderr=True)
        except docker.errors.ContainerError as e:
            text = (e.stderr or b"").decode("utf-8", "replace").strip() if isinstance(e.stderr, bytes) else str(e.stderr)
            raise LauncherError(f"the network helper ({image}: {' '.join(command)}) failed: {text}") from None
        except docker.errors.ImageNotFound:
            raise LauncherError(f"image {image} not found; build it with bash images/build.sh") from None
        except docker.errors.APIError as e:
            raise LauncherError(f"the network helper container failed to start: {e.explanation or e}") from None
        return out.decode("utf-8", "replace")
