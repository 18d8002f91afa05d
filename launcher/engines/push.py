"""``generate --push REGISTRY``: the image rehearsed here (or the derived one of --requirements) tagged and
pushed to the cluster's registry, and named so in the job.

    python -m launcher generate --target jobset --nodes 2 --nproc-per-node 4 --module mypkg.train \
        --requirements requirements.txt --push registry.example.com:5000

The rules: the registry answers first (``GET /v2/``, the Registry API's version check: 200, or 401
from one that asks for a login, over https, then plain http), else ConfigError with its reason and
nothing tagged, pushed or written (exit 2); then ``docker tag IMAGE REGISTRY/REPO:TAG`` and ``docker
push`` (REPO:TAG: the image's name without its own registry host, launcher/docker/hosts.py push); a
push that fails removes the tag it made and raises ConfigError with the registry's reason. The
document then names ``REGISTRY/REPO:TAG`` wherever it names the image (the pods, SkyPilot's
image_id, pyxis's --container-image, the stack). Docker pushes over plain http only to a loopback
registry or one in the daemon's ``insecure-registries``.
"""
from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request

from simcluster.launcher.docker import hosts as docker_hosts
from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.engines.checks import has_registry
from simcluster.launcher.job.launch import Launch
from simcluster.core.errors import ConfigError

TIMEOUT_S = 5.0  # each probe of the registry


def pushed_name(image: str, registry: str) -> str:
    """``REGISTRY/REPO:TAG``: image under registry, its own registry host (if any) dropped."""
    repo = image.split("/", 1)[1] if has_registry(image) else image
    return f"{registry.rstrip('/')}/{repo}"


def registry_problem(registry: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """Why the registry (its host part) does not answer as a Docker registry, or None when it does."""
    host = registry.split("/", 1)[0]
    reasons = []
    for scheme in ("https", "http"):
        try:
            with urllib.request.urlopen(f"{scheme}://{host}/v2/", timeout=timeout_s) as reply:
                if reply.status == 200:
                    return None
                reasons.append(f"{scheme}: HTTP {reply.status}")
        except urllib.error.HTTPError as e:
            if e.code == 401:  # a registry that wants a login answers so; docker login is the user's own step
                return None
            reasons.append(f"{scheme}: HTTP {e.code}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            reasons.append(f"{scheme}: {getattr(e, 'reason', e)}")
    return "; ".join(reasons)


def check_registry(registry: str) -> None:
    """Raises ConfigError naming the reason and the fix when the registry does not answer."""
    if why := registry_problem(registry):
        raise ConfigError(f"--push {registry}: no Docker registry answers at {registry.split('/', 1)[0]}/v2/ ({why}); "
                          f"nothing was tagged, pushed or written. Start it or name one that runs, e.g. --push "
                          f"localhost:5000 (docker-registry on this machine) or --push registry.example.com:5000")


def with_pushed(launch: Launch, say=print) -> Launch:
    """The launch with its nodes' image pushed to --push's registry and named there; the launch itself
    without --push. Call after the registry answered (check_registry) and after the derived image exists.

    Raises:
        ConfigError: the push failed (the registry's reason); the tag made is removed again.
    """
    registry = launch.engine.push
    if not registry:
        return launch
    image, target = launch.node.image, pushed_name(launch.node.image, registry)
    say(f"launcher | docker push {target} (from {image})")
    try:
        docker_hosts.push(image, registry.rstrip("/"), target[len(registry.rstrip("/")) + 1:])
    except LauncherError as e:
        docker_hosts.untag(target)
        raise ConfigError(f"--push {registry}: {e}; nothing is written. Check that the registry takes pushes from "
                          f"this machine (plain http: a loopback address, or the daemon's insecure-registries)") from e
    return dataclasses.replace(launch, node=dataclasses.replace(launch.node, image=target))
