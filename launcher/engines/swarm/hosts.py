"""Rehearsal hosts of ``up --target swarm --hosts N``: N Docker engines in containers, one swarm, a registry, shared storage.

    python -m launcher up --target swarm --hosts 2 --mesh 2x1x1 --model tiny --steps 3

``bring_up`` makes what a user has on real machines, here (launcher/docker/hosts.py does the SDK calls):
  1. hosts host-0 .. host-N-1, each a Docker engine (images/host, built offline from Debian's
     docker.io when missing) in a container on the private bridge ``simcluster-hosts``;
  2. one swarm: host-0 is the manager (``swarm init --advertise-addr`` its address there), the
     others join it as workers, as ``docker swarm join --token`` does on real hosts;
  3. the image through a registry: host-0 serves Debian's docker-registry on :5000, every host's
     engine trusts ``host-0:5000`` as an insecure registry; this machine pushes the trainer image
     (or --requirements' derived one) to it, every host pulls it, and the stack names
     ``host-0:5000/<repo>``;
  4. shared storage: the run folder, the code and the data are mounted into every host at their
     own absolute paths, as an NFS export mounted at the same path on every machine;
  5. --inter-host-bandwidth: tc tbf on each host's link to the others (its eth0 on the bridge).
The run folder's RUN_DIR/hosts.json records the hosts (``read``), so status, logs, down and chaos
reach them later; ``take_down`` removes the hosts (their volumes, the image caches and the
registry's storage, are kept for the next rehearsal, as real hosts keep their disks).
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

from simcluster.launcher.docker import hosts as dh
from simcluster.launcher.docker import images
from simcluster.launcher.docker.hosts import HOSTS_FILE
from simcluster.launcher.engines.checks import has_registry
from simcluster.launcher.job import files
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.drills.shaping import tbf_command
from simcluster.core.errors import ConfigError
from simcluster.core.layout import host_names

REGISTRY = f"host-0:{dh.REGISTRY_PORT}"  # how the hosts name the registry (host-0's name on the bridge)
ENGINE_TIMEOUT_S = 60.0  # each host's engine answers by then


@dataclass(frozen=True)
class Rehearsal:
    """The hosts of one run: run_dir (absolute), hosts ((name, engine URL on 127.0.0.1), host-0 first),
    registry (this machine's address of host-0's registry, 127.0.0.1:PORT), bring_up_s (seconds)."""

    run_dir: str
    hosts: tuple[tuple[str, str], ...]
    registry: str
    bring_up_s: float = 0.0

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.hosts]

    @property
    def record(self) -> str:
        """RUN_DIR/hosts.json, this record's file (written as the run starts)."""
        return os.path.join(self.run_dir, HOSTS_FILE)


def hosted_image(image: str) -> str:
    """The name every host pulls ``image`` by: ``host-0:5000/<repo:tag>`` (a registry in image's name is
    replaced: the rehearsal reaches none outside)."""
    repo = image.split("/", 1)[1] if has_registry(image) else image
    return f"{REGISTRY}/{repo}"


def shared_paths(launch: Launch) -> list[str]:
    """The host paths every host mounts at the same path (the shared storage): the run folder's parent
    (the runs folder, so later runs on kept hosts find theirs), the data and code sources, and this
    checkout's code with --mount-code."""
    paths = [os.path.dirname(files.host_abspath(launch.run_dir))]
    paths += [files.host_abspath(m.source) for m in launch.mounts]
    if launch.node.mount_code:
        paths += [host for host, _ in files.code_mounts()]
    return sorted(set(paths))


def _ensure_host_image(show) -> None:
    if images.image_created(dh.HOST_IMAGE) is not None:
        return
    base = "simcluster/base:bookworm" if images.image_created("simcluster/base:bookworm") else "simcluster/trainer:latest"
    show(f"launcher | building {dh.HOST_IMAGE} (images/host/Dockerfile FROM {base}: Debian's docker.io and "
         f"docker-registry, apt over http)")
    images.build_image(os.path.join(files.IMAGES, "host"), dh.HOST_IMAGE, buildargs={"BASE_IMAGE": base})


def _reuse(up: dict, launch: Launch, show) -> Rehearsal:
    """The hosts an `up --keep` left, for launch: the same count, every shared path on their storage.

    Raises:
        ConfigError: they do not fit (naming why and `down`).
    """
    names = host_names(launch.engine.hosts)
    owner = next(iter(up.values())).labels.get(dh.HOSTS_LABEL, "?")
    down = f"take them down first: python -m launcher down --run-dir {owner}"
    if sorted(up) != sorted(names):
        raise ConfigError(f"--hosts {launch.engine.hosts}: rehearsal hosts {', '.join(sorted(up))} of {owner} are up "
                          f"(an `up --keep`); rerun with --hosts {len(up)} to reuse them, or {down}")
    mounted = dh.bind_sources(up[names[0]])
    if missing := [p for p in shared_paths(launch) if not any(p == m or p.startswith(m + "/") for m in mounted)]:
        raise ConfigError(f"--hosts: the kept hosts of {owner} do not mount {', '.join(missing)} (their shared "
                          f"storage is {', '.join(mounted)}); use a run folder beside {owner}, or {down}")
    t0 = time.monotonic()
    urls = {n: f"tcp://127.0.0.1:{dh.published(up[n], dh.API_PORT)}" for n in names}
    clients = {n: dh.wait_daemon(urls[n], up[n], ENGINE_TIMEOUT_S) for n in names}
    reh = Rehearsal(files.host_abspath(launch.run_dir), tuple((n, urls[n]) for n in names),
                    f"127.0.0.1:{dh.published(up[names[0]], dh.REGISTRY_PORT)}")
    show(f"launcher | reusing hosts {', '.join(names)} of {owner} (kept by up --keep)")
    _distribute(launch.node.image, reh, clients, show, None)
    reh = Rehearsal(reh.run_dir, reh.hosts, reh.registry, round(time.monotonic() - t0, 1))
    _write(reh)
    return reh


def bring_up(launch: Launch, show) -> Rehearsal:
    """Hosts, swarm, registry, image, shared storage and shaping for launch (see the module docstring),
    or the hosts an `up --keep` left (reused when they fit); writes RUN_DIR/hosts.json. On failure
    every host started here is removed before the error propagates.

    Raises:
        ConfigError: kept hosts that do not fit; this engine cannot run engines in containers.
        LauncherError: an engine, the swarm, the push or a pull failed.
    """
    t0 = time.monotonic()
    run_dir = files.host_abspath(launch.run_dir)
    files.make_run_dir(run_dir, launch.node.user)  # the containers' user's while it is empty: hosts.json goes in next
    if up := dh.host_containers():
        return _reuse(up, launch, show)
    _ensure_host_image(show)
    names = host_names(launch.engine.hosts)
    dh.make_network()
    started = {}
    try:
        for name in names:
            started[name] = dh.start_host(name, run_dir, shared_paths(launch), registry=name == names[0])
        registry = f"127.0.0.1:{dh.published(started[names[0]], dh.REGISTRY_PORT)}"
        push = _Push(launch.node.image, registry)  # the registry answers before host-0's engine: push meanwhile
        urls = {n: f"tcp://127.0.0.1:{dh.published(c, dh.API_PORT)}" for n, c in started.items()}
        clients = {n: dh.wait_daemon(urls[n], started[n], ENGINE_TIMEOUT_S) for n in names}
        for c in clients.values():
            dh.prune(c)
        dh.make_swarm(clients[names[0]], dh.address(started[names[0]]), [clients[n] for n in names[1:]])
        show(f"launcher | hosts {', '.join(names)} up, one swarm (manager host-0) after {time.monotonic() - t0:.1f}s")
        reh = Rehearsal(run_dir, tuple((n, urls[n]) for n in names), registry)
        _distribute(launch.node.image, reh, clients, show, push)
        if rate := launch.engine.inter_host_bandwidth:
            for n in names:
                first = dh.exec_root(started[n], tbf_command(rate)).strip().splitlines()[0]
                show(f"launcher | {n}'s link to the other hosts limited to {rate}: {first}")
        reh = Rehearsal(reh.run_dir, reh.hosts, reh.registry, round(time.monotonic() - t0, 1))
        _write(reh)
        return reh
    except BaseException:
        for c in started.values():
            dh.remove_host(c)
        raise


class _Push(threading.Thread):
    """``docker push`` of image to the registry, in a thread; join() returns its seconds or raises its error."""

    def __init__(self, image: str, registry: str):
        super().__init__(daemon=True)
        self.image, self.registry, self.error, self.t0, self.seconds = image, registry, None, time.monotonic(), 0.0
        self.start()

    def run(self) -> None:
        try:
            dh.push(self.image, self.registry, hosted_image(self.image).split("/", 1)[1])
        except BaseException as e:  # noqa: BLE001 - raised by join, in the caller's thread
            self.error = e
        self.seconds = time.monotonic() - self.t0

    def join(self, timeout=None) -> float:
        super().join(timeout)
        if self.error is not None:
            raise self.error
        return self.seconds


def _distribute(image: str, reh: Rehearsal, clients: dict, show, push: _Push | None) -> None:
    """Push image to host-0's registry from this machine (push: one already under way), then pull it on
    every host at once."""
    push = push or _Push(image, reh.registry)
    pushed = push.join()
    t0 = time.monotonic()
    hosted = hosted_image(image)
    errors: list[BaseException] = []

    def pull(c) -> None:
        try:
            dh.pull(c, hosted)
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=pull, args=(c,)) for c in clients.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    show(f"launcher | {hosted}: pushed to host-0's registry in {pushed:.1f}s, pulled by every host in "
         f"{time.monotonic() - t0:.1f}s")


def _write(reh: Rehearsal) -> None:
    files.write_atomic(os.path.join(reh.run_dir, HOSTS_FILE), json.dumps(
        {"hosts": dict(reh.hosts), "registry": reh.registry, "bring_up_s": reh.bring_up_s}, indent=1) + "\n")


def read(run_dir: str) -> Rehearsal | None:
    """The rehearsal RUN_DIR/hosts.json records, or None (a run on one engine).

    Raises:
        ConfigError: the file is not what bring_up writes (naming it).
    """
    path = os.path.join(run_dir, HOSTS_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        hosts = doc["hosts"]
        if not (isinstance(hosts, dict) and hosts and all(isinstance(k, str) and k and isinstance(v, str) and v
                                                          for k, v in hosts.items())):
            raise ValueError(f"its hosts are {hosts!r}, not one name -> engine URL or more")
        if not isinstance(doc["registry"], str) or isinstance(doc["bring_up_s"], bool) \
                or not isinstance(doc["bring_up_s"], (int, float)):
            raise TypeError("registry is not text, or bring_up_s not a number")
        return Rehearsal(os.path.abspath(run_dir), tuple(hosts.items()), doc["registry"], float(doc["bring_up_s"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: not a hosts record of `up --hosts` ({type(e).__name__}: {e}); it is written "
                          f"by python -m launcher up --target swarm --hosts N") from None


def take_down(show) -> None:
    """Remove the rehearsal hosts (their containers; every task container inside goes with them) and the
    hosts' network. Their volumes stay (the module docstring)."""
    t0 = time.monotonic()
    found = dh.host_containers()
    for c in found.values():
        dh.remove_host(c)
    dh.remove_network()
    if found:
        show(f"launcher | hosts {', '.join(sorted(found))} removed ({time.monotonic() - t0:.1f}s)")
