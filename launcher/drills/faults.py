"""Faults a test schedules for its run: ``simcluster.run(..., chaos=Kill("node-1", at_step=3))``.

    python -c "from simcluster import Kill, Freeze; print(Kill('node-1', at_step=3), Freeze(rank=5, at_step=2))"

Each is a frozen description of one ``python -m launcher chaos`` (drills/chaos.py, the one
mechanism): wait until the run reaches step ``at_step`` (the last row of its metrics.jsonl, or,
for your code, the instruments' steps: each optimizer step or simcluster.step() counts, so a
script need not log its own), then apply the fault to the node's container:

    Kill(node)        docker kill: the container and its ranks die at once
    Stop(node)        docker stop: SIGTERM, then SIGKILL after 10 s
    Pause(node)       docker pause: the node freezes, its sockets stay open
    Disconnect(node)  docker network disconnect: the node loses the cluster network
    Freeze(rank=R)    SIGSTOP one rank's process inside its node (the node's heartbeat goes on)
    KillHost(host)    up --hosts: docker kill a rehearsal host's engine (drills/host_chaos.py)
    DisconnectHost(host)  up --hosts: cut a rehearsal host off the hosts' network

``simcluster.run`` checks each against the launch before anything starts (``check``), runs each
in a thread beside the cluster (``start``) and keeps what it printed in ``Run.chaos``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

from simcluster.launcher.job.sections import MAX_STEPS
from simcluster.core.errors import ConfigError


@dataclass(frozen=True)
class NodeFault:
    """One fault of one node at one step: node (``node-1``), at_step (>= 1)."""

    node: str
    at_step: int = 1
    kind: ClassVar[str] = ""

    @property
    def target(self) -> str:
        """What ``launcher chaos --KIND`` takes: the node's name (a rank's number for Freeze)."""
        return self.node

    def problem(self, names: tuple[str, ...], world_size: int) -> str | None:
        """Why this fault cannot be applied to a launch of these nodes, or None."""
        if self.node not in names:
            return f"no node {self.node!r} in this launch; its nodes are {', '.join(names)}"
        return None

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.target!r}, at_step={self.at_step})"


class Kill(NodeFault):
    kind = "kill"


class Stop(NodeFault):
    kind = "stop"


class Pause(NodeFault):
    kind = "pause"


class Disconnect(NodeFault):
    kind = "disconnect"


@dataclass(frozen=True)
class Freeze:
    """SIGSTOP global rank ``rank``'s process at step at_step (its node's heartbeat goes on, so the
    rendezvous finds it through the job's timeout, not the node's)."""

    rank: int
    at_step: int = 1
    kind: ClassVar[str] = "freeze"

    @property
    def target(self) -> str:
        return str(self.rank)

    def problem(self, names: tuple[str, ...], world_size: int) -> str | None:
        if not isinstance(self.rank, int) or not 0 <= self.rank < world_size:
            return f"rank {self.rank!r} is not a rank of this launch (0..{world_size - 1})"
        return None

    def __str__(self) -> str:
        return f"Freeze(rank={self.rank}, at_step={self.at_step})"


@dataclass(frozen=True)
class HostFault:
    """One fault of one rehearsal host (``up --target swarm --hosts N``) at one step: host (``host-1``),
    at_step (>= 1); every node on the host goes with it (drills/host_chaos.py)."""

    host: str
    at_step: int = 1
    kind: ClassVar[str] = ""

    @property
    def target(self) -> str:
        return self.host

    def problem(self, names: tuple[str, ...], world_size: int, hosts: tuple[str, ...] = ()) -> str | None:
        if not hosts:
            return "a host fault needs rehearsal hosts; add target='swarm', hosts=2"
        if self.host not in hosts:
            return f"no host {self.host!r} in this launch; its hosts are {', '.join(hosts)}"
        if self.kind == "kill-host" and self.host == hosts[0]:
            return f"{self.host} is the swarm's only manager and the registry; kill a worker, e.g. {hosts[-1]!r}"
        return None

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.host!r}, at_step={self.at_step})"


class KillHost(HostFault):
    kind = "kill-host"


class DisconnectHost(HostFault):
    kind = "disconnect-host"


FAULT_TYPES = (Kill, Stop, Pause, Disconnect, Freeze, KillHost, DisconnectHost)


def as_faults(chaos) -> tuple:
    """None, one fault or a sequence of them -> a tuple of faults.

    Raises:
        ConfigError: anything else, naming the fault types.
    """
    faults = () if chaos is None else (chaos,) if isinstance(chaos, FAULT_TYPES) else tuple(chaos) \
        if isinstance(chaos, (list, tuple)) else None
    if faults is None or not all(isinstance(f, FAULT_TYPES) for f in faults):
        raise ConfigError(f"chaos: expected a fault or a list of them ({', '.join(t.__name__ for t in FAULT_TYPES)}), "
                          f"got {chaos!r}; e.g. chaos=Kill('node-1', at_step=3)")
    return faults


def check(faults: tuple, names: tuple[str, ...], world_size: int, hosts: tuple[str, ...] = ()) -> list[str]:
    """The problems of the faults for a launch of these nodes, ranks and rehearsal hosts, each naming the fault."""
    errors = []
    for f in faults:
        if isinstance(f.at_step, bool) or not isinstance(f.at_step, int) or not 1 <= f.at_step <= MAX_STEPS:
            errors.append(f"chaos: {f}: at_step must be an int from 1 to {MAX_STEPS} (a bool is no step), got "
                          f"{f.at_step!r}; e.g. {type(f).__name__}(..., at_step=3)")
        elif why := (f.problem(names, world_size, hosts) if isinstance(f, HostFault) else f.problem(names, world_size)):
            errors.append(f"chaos: {f}: {why}")
    return errors


def start(fault, run_dir: str, wait_s: float, lines: list[str], engine) -> threading.Thread:
    """Run ``launcher chaos`` for the fault against the run folder of engine's job (launcher/engines/base.py
    Engine: asked for the run's Docker client, nodes and hosts) in a daemon thread, appending what it says to
    lines; the thread ends once the fault is applied, the run ended, or wait_s passed."""
    from simcluster.launcher.drills.chaos import chaos
    from simcluster.launcher.drills.host_chaos import chaos_host

    def go() -> None:
        try:
            say = lambda text, error=False: lines.append(text)  # noqa: E731
            if isinstance(fault, HostFault):  # its run folder is made by the `up` starting beside it
                chaos_host(fault.kind, fault.target, fault.at_step, run_dir=run_dir, wait_s=wait_s, say=say,
                           starting=True, engines=(engine,))
            else:
                chaos(fault.kind, fault.target, fault.at_step, run_dir=run_dir, wait_s=wait_s, say=say,
                      engines=(engine,))
        except Exception as e:  # noqa: BLE001 - a fault that could not be applied is reported, not raised
            lines.append(f"chaos: {fault} failed: {type(e).__name__}: {e}")

    thread = threading.Thread(target=go, name=f"chaos-{fault.kind}", daemon=True)
    thread.start()
    return thread
