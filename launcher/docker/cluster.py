"""What spans containers, through the Docker SDK: networks, labels, the swarm and its stacks, events.

    python -c "from simcluster.launcher.docker.client import Client; from simcluster.launcher.docker.cluster import labelled; print(labelled(Client(), 'simcluster.slurm'))"

Beside client.py (the client, its errors and the containers of a project) in launcher/docker/, the
folder that alone touches the SDK (tests/test_launcher_edge.py test_docker_through_the_sdk_only).
Each function is handed the Client it acts through. ``Events`` follows the daemons' container
events of a project or a stack (observe/follow.py's Watch waits on it instead of polling).
"""
from __future__ import annotations

import threading

from simcluster.launcher.docker.client import (PROJECT_LABEL, STACK_LABEL, Client, LauncherError, sdk_errors, service_of,
                                               stack_service)
from simcluster.launcher.docker.container import remove


def network(client: Client, name: str):
    """The network called name, or None when there is none. Raises LauncherError: the daemon failed."""
    with sdk_errors(f"looking up network {name}", missing_ok=True):
        return client.sdk().networks.get(name)


def create_network(client: Client, name: str, labels: dict[str, str] | None = None) -> None:
    """Create an internal bridge network called name (no route out), with labels. Raises LauncherError: the daemon
    refused (e.g. the name is taken)."""
    with sdk_errors(f"`docker network create --internal {name}`"):
        client.sdk().networks.create(name, driver="bridge", internal=True, labels=labels or {})


def remove_network(client: Client, name: str) -> None:
    """``docker network rm`` the network called name; gone is fine. Raises LauncherError: the daemon refused (e.g. a
    container is still on it)."""
    with sdk_errors(f"`docker network rm {name}`", missing_ok=True):
        client.sdk().networks.get(name).remove()


def attach(client: Client, network: str, container, aliases: list[str]) -> None:
    """Connect container to the network called name under aliases (names it resolves by there), disconnecting it
    first (``docker run --network`` attached it without them). Raises LauncherError: the network or container is
    gone, or the daemon refused."""
    with sdk_errors(f"`docker network connect --alias {','.join(aliases)} {network} {container.name}`"):
        net = client.sdk().networks.get(network)
        net.disconnect(container)
        net.connect(container, aliases=aliases)


def labelled(client: Client, label: str) -> tuple[list, list]:
    """(containers in every state, networks) carrying the label ``KEY=VALUE``, on every daemon that answers
    (each rehearsal host's). Raises LauncherError: the daemon failed."""
    found, nets = [], []
    by = {"label": label}
    for _, c in client.sdks():
        with sdk_errors(f"listing what carries {label}"):
            found += c.containers.list(all=True, filters=by, ignore_removed=True)
            nets += c.networks.list(filters=by)
    return found, nets


def remove_labelled(client: Client, label: str) -> None:
    """Force-remove every container, then every network, carrying the label; gone meanwhile is fine. Raises
    LauncherError: the daemon refused one (the rest are left then)."""
    found, nets = labelled(client, label)
    for c in found:
        remove(c)
    for n in nets:
        try:
            with sdk_errors(f"`docker network rm {n.name}`", missing_ok=True):
                n.remove()
        except LauncherError as e:
            if "not found" not in str(e):  # a swarm's network removed meanwhile answers 500 "not found", not 404
                raise


def swarm_init(client: Client, addr: str) -> None:
    """Make this daemon a one-node swarm manager (``docker swarm init --advertise-addr ADDR``). Raises
    LauncherError: the daemon refused (its explanation)."""
    with sdk_errors(f"`docker swarm init --advertise-addr {addr}`"):
        client.sdk().swarm.init(advertise_addr=addr)


def swarm_leave(client: Client) -> None:
    """``docker swarm leave --force``. Raises LauncherError: the daemon refused."""
    with sdk_errors("`docker swarm leave --force`"):
        client.sdk().swarm.leave(force=True)


def stack_tasks(client: Client, stack: str) -> dict[str, list[dict]]:
    """service (without the ``<stack>_`` prefix) -> its tasks (the daemon's dicts: Status, CreatedAt, ..), oldest
    first, of every service of a swarm stack; {} when none is up. Raises LauncherError: the daemon failed (e.g. a
    service went away while listed)."""
    with sdk_errors(f"listing the services of stack {stack}"):
        return {stack_service(stack, svc.name) or svc.name: sorted(svc.tasks(), key=lambda t: t["CreatedAt"])
                for svc in client.sdk().services.list(filters={"label": f"{STACK_LABEL}={stack}"})}


class Events:
    """Follows the daemon's container events of a project (or a swarm stack when stack), on every
    daemon that answers (each rehearsal host's), one thread a stream:
    ``state`` maps service -> the container state after its latest event (running, paused,
    exited), ``on_change`` is set on every change. Seeded from one listing; ``start()``, then
    ``close()``. A host's stream that breaks (its daemon killed) just ends."""

    STATES = {"start": "running", "unpause": "running", "pause": "paused", "die": "exited", "destroy": "removed"}

    def __init__(self, client: Client, project: str, stack: bool = False):
        self.project, self.stack = project, stack
        self.on_change = threading.Event()
        label = f"{STACK_LABEL if stack else PROJECT_LABEL}={project}"
        self._streams = [c.events(decode=True, filters={"type": "container", "label": label}) for _, c in client.sdks()]
        self.state = {s: c.status for s, c in client.containers(project, stack).items()}

    def start(self) -> None:
        for stream in self._streams:
            threading.Thread(target=self._follow, args=(stream,), daemon=True, name=f"events-{self.project}").start()

    def _follow(self, stream) -> None:
        try:
            for ev in stream:
                new = self.STATES.get(ev.get("Action") or ev.get("status"))
                service = service_of((ev.get("Actor") or {}).get("Attributes", {}), self.project, self.stack)
                if new and service:
                    self.state[service] = new
                    self.on_change.set()
        except Exception:  # noqa: BLE001 - the stream was closed, or its daemon went away
            pass

    def close(self) -> None:
        for stream in self._streams:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - its daemon is gone
                pass
