"""Images through the Docker SDK: labels, ids, creation times, builds, the module probe, one-shot runs.

    python -c "from simcluster.launcher.docker.images import image_labels; print(image_labels('simcluster/trainer:latest'))"

Images live on this machine's daemon (``Client()``: rehearsal hosts pull theirs from host-0's
registry, hosts.py). One of the modules of launcher/docker/ that touch the SDK (client.py's
docstring says which and why); callers get small named functions that raise LauncherError with the
daemon's explanation.
"""
from __future__ import annotations

import os
from datetime import datetime

import docker
from docker.errors import DockerException, NotFound

from simcluster.launcher.docker.client import Client, LauncherError, sdk_errors


def _here():
    """The SDK client of this machine's daemon, where images are built and kept."""
    return Client().sdk()


def image_labels(image: str) -> dict[str, str] | None:
    """The image's labels ({} when it has none), or None if it does not exist."""
    try:
        return _here().images.get(image).labels or {}
    except NotFound:
        return None


def image_created(image: str) -> float | None:
    """UNIX time the image was created, or None if it does not exist."""
    try:
        text = _here().images.get(image).attrs["Created"]
    except NotFound:
        return None
    return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()


def image_id(image: str) -> str | None:
    """The image's id (``sha256:...``), or None if it does not exist."""
    try:
        return _here().images.get(image).id
    except NotFound:
        return None


def build_image(path: str, tag: str, labels: dict[str, str] | None = None,
                buildargs: dict[str, str] | None = None) -> None:
    """``docker build -t TAG PATH`` (intermediate containers removed), with ``labels`` added and
    ``buildargs`` (--build-arg). Raises LauncherError: the build failed (its message)."""
    if not os.path.isdir(path):  # the SDK raises TypeError then
        raise LauncherError(f"`docker build -t {tag} {path}`: no such folder")
    with sdk_errors(f"`docker build -t {tag} {path}`"):
        _here().images.build(path=path, tag=tag, rm=True, labels=labels or {}, buildargs=buildargs or {})


def run_once(image: str, command: list[str]) -> str:
    """Run ``command`` in a fresh container of image, without a network, to its end; its stdout. Raises
    LauncherError: the image is missing, or the command failed (its stderr's end)."""
    try:
        out = _here().containers.run(image, command, remove=True, network_disabled=True, stdout=True, stderr=False)
    except docker.errors.ContainerError as e:
        text = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else str(e.stderr or "")
        raise LauncherError(f"`{' '.join(command)}` in {image} exited {e.exit_status}: {text.strip()[-400:]}") from None
    except DockerException as e:
        raise LauncherError(f"`{' '.join(command)}` in {image}: {getattr(e, 'explanation', None) or e}") from None
    return out.decode("utf-8", "replace")


PROBE = """
import importlib.util, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False
missing = [m for m in sys.argv[1:] if not found(m)]
if missing:
    print("cannot import " + ", ".join(missing), file=sys.stderr)
sys.exit(3 if missing else 0)
"""


def probe_image(image: str, modules: list[str], volumes: list[str], user: str) -> str | None:
    """Start a short container of image that looks for each module with Python (``-c PROBE``),
    with the job's bind mounts (``SRC:DST:MODE``); None when all are found, else what is wrong.

    Raises:
        LauncherError: the daemon itself failed.
    """
    if image_created(image) is None:
        return f"image {image} not found (nothing is pulled: build it, or docker pull / docker load it first)"
    try:
        _here().containers.run(image, ["python", "-c", PROBE, *modules], remove=True, user=user,
                                network_disabled=True, volumes=volumes, stdout=True, stderr=True)
        return None
    except docker.errors.ContainerError as e:
        text = (e.stderr or b"").decode("utf-8", "replace").strip() if isinstance(e.stderr, bytes) else str(e.stderr or "")
        return text.splitlines()[-1] if text else f"the probe exited {e.exit_status}"
    except docker.errors.APIError as e:
        if "executable file not found" in str(e) or "no such file" in str(e).lower():
            return f"image {image} has no `python` on its PATH"
        raise LauncherError(f"the probe container of {image} failed: {e.explanation or e}") from None
