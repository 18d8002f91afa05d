"""Checks of a target before anything is written or started: each problem names the fix (exit 2).

    python -c "from launcher.targets.check import has_registry; print(has_registry('ghcr.io/x/y:1'))"

A multi-host target (slurm with --container-image, jobset, trainjob)
pulls its image on hosts that never saw this machine's `docker build`: the image must name a
registry (``ghcr.io/me/trainer:1``, ``registry.local:5000/trainer:1``, ``docker.io/me/trainer:1``).
Your own code from a host folder (--script, --code) exists only in the Compose simulation: on
the other engines it has to be in the image (--module) or in the Slurm work folder.
``up --target slurm`` needs only Docker (the Slurm image is built when missing).
"""
from __future__ import annotations

from launcher.launch import Launch
from train.config import ConfigError


def has_registry(image: str) -> bool:
    """True when the image's first path part names a registry host (has a dot or a port, or is localhost)."""
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def check_target(target: str, launch: Launch, local: bool) -> None:
    """Raise ConfigError when launch cannot go to target. local: `up` on this machine (one host:
    a local image is fine)."""
    errors = []
    if target != "compose" and launch.workdir is not None:
        errors.append(f"--target {target}: your code folder ({launch.mounts[0].source if launch.mounts else '?'}) "
                      f"is mounted only by the Compose simulation; bake it into an image and pass --image IMAGE "
                      f"--module NAME")
    image = launch.engine.container_image if target == "slurm" else launch.node.image
    if not local and target in ("jobset", "trainjob") or (target == "slurm" and image):
        if image and not has_registry(image):
            flag = "--container-image" if target == "slurm" else "--image"
            errors.append(f"{flag} {image}: a {target} job runs on other hosts, which cannot see a locally built "
                          f"image; push it to a registry and name it there, e.g. {flag} "
                          f"registry.example.com/{image}")
    if errors:
        raise ConfigError("\n  ".join([f"--target {target}:", *errors]))
