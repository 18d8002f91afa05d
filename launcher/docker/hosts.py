"""Rehearsal hosts through the Docker SDK: Docker daemons in containers of this machine's daemon.

    python -c "from simcluster.launcher.docker.hosts import host_containers; print(host_containers())"

One of the modules of launcher/docker/, the folder that alone touches the SDK (tests/test_launcher_edge.py
test_docker_through_the_sdk_only): each host is a container of HOST_IMAGE (images/host: Debian's
docker.io, and docker-registry on host-0) on this machine's daemon (``Client()``), started with
what a daemon in a container needs here (../shared/notes/engines-in-containers.md: every capability
but SYS_RESOURCE, which this machine's bounding set lacks, so no --privileged; seccomp, AppArmor and
the kernel's system paths unconfined; /sys/fs/cgroup read-write; /var/lib/docker on a volume of
its own, so the inner daemon uses overlay2). Its API (2375) and host-0's registry (5000) are
published on 127.0.0.1 only. Every object carries HOSTS_LABEL; the volumes (each host's image cache,
the registry's storage) outlive a rehearsal, as real hosts' disks do.
"""
from __future__ import annotations

import time

import docker
from docker.errors import APIError, DockerException, NotFound
from requests.exceptions import RequestException

from simcluster.launcher.docker.client import Client, LauncherError, sdk_errors
from simcluster.launcher.container.layout import LABEL
from simcluster.core.errors import ConfigError

HOST_IMAGE = "simcluster/host:latest"
HOSTS_FILE = "hosts.json"  # RUN_DIR/hosts.json: the record of a run's rehearsal hosts (engines/swarm/hosts.py writes it)
HOSTS_LABEL = LABEL + "hosts"  # on each host container and the hosts' network: the run folder's path
API_PORT, REGISTRY_PORT = 2375, 5000
NETWORK = "simcluster-hosts"  # the rehearsal's private network (a bridge of this machine's daemon)
PRIVILEGES = dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE"], tmpfs={"/run": ""},
                  security_opt=["seccomp=unconfined", "apparmor=unconfined"])


def _here():
    """The SDK client of this machine's daemon, which runs the host containers."""
    return Client().sdk()


def start_host(name: str, run_dir: str, mounts: list[str], registry: bool):
    """Start host ``name`` (its hostname and alias on NETWORK) with the same-path binds ``mounts`` (the shared
    storage: the run folder, the code, the data); host-0 (registry) also serves the registry. Returns the container.

    Raises:
        ConfigError: this machine's daemon cannot start a daemon in a container (the capabilities, the
            cgroup mount), naming what is missing.
        LauncherError: the daemon refused otherwise.
    """
    volumes = {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
               f"simcluster-{name}-engine": {"bind": "/var/lib/docker", "mode": "rw"}}
    if registry:
        volumes["simcluster-registry"] = {"bind": "/var/lib/docker-registry", "mode": "rw"}
    volumes.update({m: {"bind": m, "mode": "rw"} for m in mounts})
    ports = {f"{API_PORT}/tcp": ("127.0.0.1", None), **({f"{REGISTRY_PORT}/tcp": ("127.0.0.1", None)} if registry else {})}
    try:
        return _here().containers.run(
            HOST_IMAGE, name=f"simcluster-{name}", hostname=name, detach=True, network=NETWORK, ports=ports,
            volumes=volumes, environment={"SIMCLUSTER_REGISTRY": "1" if registry else "0"},
            labels={HOSTS_LABEL: run_dir, HOSTS_LABEL + ".host": name}, **PRIVILEGES)
    except APIError as e:
        why = e.explanation or str(e)
        if "not permitted" in why or "permission denied" in why.lower() or "cgroup" in why:
            raise ConfigError(
                f"--hosts: this machine's Docker engine cannot run an engine in a container: {why}. A rehearsal host "
                f"needs every capability but SYS_RESOURCE (--cap-add ALL --cap-drop SYS_RESOURCE), seccomp and "
                f"AppArmor unconfined, and /sys/fs/cgroup mounted read-write: a rootful engine without user "
                f"namespaces (docker info: Security Options) does; rootless Docker does not") from None
        raise LauncherError(f"starting rehearsal host {name} failed: {why}") from None


def make_network() -> None:
    """The hosts' private bridge NETWORK (made when missing; kept, as a machine room's switch)."""
    with sdk_errors(f"`docker network create {NETWORK}`"):
        if not _here().networks.list(names=[NETWORK]):
            _here().networks.create(NETWORK, driver="bridge", labels={HOSTS_LABEL: ""})


def published(container, port: int) -> int:
    """The 127.0.0.1 port this machine reaches container's ``port`` on. Raises LauncherError: none published."""
    with sdk_errors(f"`docker port {container.name}`"):
        container.reload()
        bound = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{port}/tcp") or []
        if not bound:
            raise LauncherError(f"{container.name} publishes no port for {port}")
        return int(bound[0]["HostPort"])


def address(container) -> str:
    """container's IP address on NETWORK (where the other hosts reach it)."""
    with sdk_errors(f"`docker inspect {container.name}`"):
        container.reload()
        return container.attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]


def wait_daemon(url: str, container, timeout_s: float) -> docker.DockerClient:
    """A client of the daemon at url once it answers. Raises LauncherError: its container exited (its log's
    last lines in the message) or timeout_s passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            c = docker.DockerClient(base_url=url, timeout=10)
            c.ping()
            return c
        except (DockerException, RequestException) as e:
            container.reload()
            if container.status != "running" or time.monotonic() > deadline:
                tail = container.logs(tail=3).decode("utf-8", "replace").strip()
                raise LauncherError(f"the engine of {container.name} did not answer at {url} within {timeout_s:.0f}s "
                                    f"({container.status}; {type(e).__name__}: {e}): {tail}") from None
            time.sleep(0.3)


def make_swarm(manager: docker.DockerClient, addr: str, workers: list[docker.DockerClient]) -> None:
    """``docker swarm init --advertise-addr ADDR`` on manager, then ``docker swarm join`` each worker.
    Raises LauncherError: a daemon refused."""
    with sdk_errors(f"`docker swarm init --advertise-addr {addr}` on host-0"):
        manager.swarm.init(advertise_addr=addr, listen_addr=f"{addr}:2377")
        manager.swarm.reload()
        token = manager.swarm.attrs["JoinTokens"]["Worker"]
    for w in workers:
        with sdk_errors("`docker swarm join` of a rehearsal host"):
            w.swarm.join(remote_addrs=[f"{addr}:2377"], join_token=token)


def swarm_nodes(manager: docker.DockerClient) -> dict[str, str]:
    """hostname -> state (ready, down) of every swarm node, from the manager."""
    with sdk_errors("`docker node ls`"):
        return {n.attrs["Description"]["Hostname"]: n.attrs["Status"]["State"] for n in manager.nodes.list()}


def push(image: str, registry: str, repo: str) -> None:
    """Tag this machine's ``image`` as ``REGISTRY/REPO`` and push it there (layers the registry has are
    skipped). Raises LauncherError: the push failed (the registry's reason)."""
    ref = f"{registry}/{repo}"
    with sdk_errors(f"`docker push {ref}`"):
        _here().images.get(image).tag(ref)
        for line in _here().images.push(ref, stream=True, decode=True):
            if "error" in line:
                raise LauncherError(f"`docker push {ref}` failed: {line['error']}")


def untag(ref: str) -> None:
    """Remove the tag ref from this machine's engine, if it is there (the image it named stays under its other tags)."""
    try:
        _here().images.remove(ref, noprune=True)
    except DockerException:  # not there: nothing to undo
        pass


def pull(sdk: docker.DockerClient, image: str) -> None:
    """``docker pull image`` on a host's daemon (sdk: its SDK client). Raises LauncherError: the pull failed."""
    with sdk_errors(f"`docker pull {image}` on a rehearsal host"):
        sdk.images.pull(image)


def prune(sdk: docker.DockerClient) -> None:
    """Remove a host's stopped containers and unused networks (left in its volume by an earlier rehearsal)."""
    with sdk_errors("pruning a rehearsal host"):
        sdk.containers.prune()
        sdk.networks.prune()


def host_containers() -> dict[str, object]:
    """host name -> container of the rehearsal hosts on this machine (one rehearsal at a time: their
    HOSTS_LABEL names the run folder of the `up` that made them)."""
    with sdk_errors("listing rehearsal hosts"):
        found = _here().containers.list(all=True, filters={"label": HOSTS_LABEL}, ignore_removed=True)
    return {c.labels.get(HOSTS_LABEL + ".host", c.name): c for c in found}


def bind_sources(container) -> list[str]:
    """The host paths bind-mounted into container at the same path (a host's shared storage)."""
    return sorted(m["Source"] for m in container.attrs.get("Mounts", [])
                  if m.get("Type") == "bind" and m.get("Source") == m.get("Destination") and m["Source"] != "/sys/fs/cgroup")


def exec_root(container, cmd: list[str]) -> str:
    """Run cmd as root in a host container; its output. Raises LauncherError: it failed (its output)."""
    with sdk_errors(f"`docker exec {container.name} {cmd[0]}`"):
        rc, out = container.exec_run(cmd, user="0")
    text = out.decode("utf-8", "replace")
    if rc != 0:
        raise LauncherError(f"`{' '.join(cmd)}` on {container.name} failed ({rc}): {text.strip()}")
    return text


def kill_host(container) -> None:
    """``docker kill`` a host container (its daemon and every task container in it die at once). Raises
    LauncherError: the daemon refused (e.g. it is not running)."""
    with sdk_errors(f"`docker kill {container.name}`"):
        container.kill()


def cut(container) -> None:
    """Disconnect a host container from NETWORK (every link to the other hosts and to this machine's
    launcher is cut). Raises LauncherError: the daemon refused."""
    try:
        with sdk_errors(f"`docker network disconnect {NETWORK} {container.name}`"):
            _here().networks.get(NETWORK).disconnect(container, force=True)
    except LauncherError:
        with sdk_errors(f"`docker inspect {container.name}`"):
            container.reload()
            if NETWORK in (container.attrs["NetworkSettings"].get("Networks") or {}):
                raise
        # 20.10 may answer "is not connected" to a disconnect it has done: the host is cut off either way


def remove_host(container) -> None:
    """``docker rm -f`` a host container; gone is fine."""
    try:
        with sdk_errors(f"`docker rm -f {container.name}`", missing_ok=True):
            container.remove(force=True)
    except NotFound:
        pass


def remove_network() -> None:
    """``docker network rm`` NETWORK; gone is fine."""
    with sdk_errors(f"`docker network rm {NETWORK}`", missing_ok=True):
        for net in _here().networks.list(names=[NETWORK]):
            net.remove()
