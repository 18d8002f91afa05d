"""Checks of a target before anything is written or started: each problem names the fix (exit 2).

    python -c "from simcluster.launcher.engines.checks import has_registry; print(has_registry('ghcr.io/x/y:1'))"

A multi-host target (slurm with --container-image, jobset, trainjob, a swarm of several nodes)
pulls its image on hosts that never saw this machine's `docker build`: the image must name a
registry (``ghcr.io/me/trainer:1``, ``registry.local:5000/trainer:1``, ``docker.io/me/trainer:1``).
Swarm: ``generate`` only warns (a one-node swarm runs a local image, and the file does not know
the swarm's size; ``docker save | docker load`` on every host works too); ``up --target swarm``
refuses when the swarm has more than one node. Your own code from a host folder (--script,
--code) is bind-mounted by Compose and Swarm (on several swarm hosts: shared storage at the same
path); on the other engines it has to be in the image (--module) or in the Slurm work folder.
``up --target slurm`` needs only Docker (the Slurm image is built when missing).
"""
from __future__ import annotations

import os
import posixpath

from simcluster.launcher.job.launch import Launch
from simcluster.train.errors import ConfigError

BIND_MOUNTS = ("compose", "swarm")  # targets that bind-mount host folders into the nodes


def has_registry(image: str) -> bool:
    """True when the image's first path part names a registry host (has a dot or a port, or is localhost)."""
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def _no_registry(target: str, flag: str, image: str, why: str) -> str:
    return (f"{flag} {image}: {why}, which cannot see a locally built image; push it to a registry and name it "
            f"there, e.g. {flag} registry.example.com/{image}")


def check_target(target: str, launch: Launch, local: bool) -> None:
    """Raise ConfigError when launch cannot go to target. local: `up` on this machine (one host:
    a local image is fine, at most this machine's CPUs per node; a swarm's size is checked by
    check_swarm_image). Compose and Swarm: no ':' in a bind-mount path (run folder, data, code)."""
    errors = []
    if target not in BIND_MOUNTS and launch.workdir is not None:
        errors.append(f"--target {target}: your code folder ({launch.mounts[0].source if launch.mounts else '?'}) "
                      f"is mounted only by the Compose and Swarm targets; bake it into an image and pass --image "
                      f"IMAGE --module NAME")
    if target == "swarm" and launch.engine.workdir and not posixpath.isabs(launch.engine.workdir):
        errors.append(f"--workdir {launch.engine.workdir}: swarm bind mounts need an absolute host path; give the "
                      f"checkout's absolute path on shared storage, e.g. --workdir /shared/me/simcluster")
    if target in BIND_MOUNTS:
        errors += _colon_errors(launch)
    if local and launch.node.cpus_per_node is not None and launch.node.cpus_per_node > (os.cpu_count() or 1):
        errors.append(f"--cpus-per-node {launch.node.cpus_per_node:g}: this machine has {os.cpu_count()} CPUs and "
                      f"Docker refuses more ('Range of CPUs is from 0.01 to {os.cpu_count()}.00'); e.g. "
                      f"--cpus-per-node {os.cpu_count()}")
    image = launch.engine.container_image if target == "slurm" else launch.node.image
    if not local and target in ("jobset", "trainjob") or (target == "slurm" and image):
        if image and not has_registry(image):
            flag = "--container-image" if target == "slurm" else "--image"
            errors.append(_no_registry(target, flag, image, f"a {target} job runs on other hosts"))
    if errors:
        raise ConfigError("\n  ".join([f"--target {target}:", *errors]))


def _colon_errors(launch: Launch) -> list[str]:
    """Compose and Swarm bind mounts are ``SRC:DST:MODE``: a ':' in the run folder, a data path or
    the code folder would split it (Compose: ``too many colons``)."""
    paths = {"--run-dir": launch.run_dir}
    paths.update({"--code (or the --script folder)" if m.target == "/code" else f"the source of {m.target} (--data or "
                  f"--mount)": m.source for m in launch.mounts})
    return [f"{name}: {path!r} has a ':', which splits Compose's bind-mount spec SRC:DST:MODE; rename it without, "
            f"e.g. --run-dir runs/mesh-2x2x2 or --data data/corpus.txt" for name, path in paths.items() if ":" in path]


def target_warnings(target: str, launch: Launch) -> list[str]:
    """What `generate` says on stderr but does not refuse: a swarm stack with an image that names
    no registry (fine on a one-node swarm)."""
    if target == "swarm" and not has_registry(launch.node.image):
        return [f"--image {launch.node.image} names no registry: fine on a one-node swarm; on several hosts push it "
                f"to a registry (--image registry.example.com/{launch.node.image}) or copy it to every host "
                f"(docker save {launch.node.image} | ssh HOST docker load)"]
    return []


def check_swarm_image(launch: Launch, swarm_nodes: int) -> None:
    """`up --target swarm`: a swarm of several nodes needs an image a registry serves.

    Raises:
        ConfigError: swarm_nodes > 1 and the image names no registry.
    """
    if swarm_nodes > 1 and not has_registry(launch.node.image):
        raise ConfigError("--target swarm:\n  " + _no_registry(
            "swarm", "--image", launch.node.image, f"this swarm has {swarm_nodes} nodes, so tasks may run on "
            f"other hosts") + "; an image you copied to every host (docker save | docker load) runs with the "
            "generated stack: python -m launcher generate --target swarm, then docker stack deploy")
