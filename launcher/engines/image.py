"""The trainer image every engine runs: built when missing, checked for this installation's code.

    python -c "from simcluster.launcher.engines.image import ensure_image; ensure_image('simcluster/trainer:latest', False)"

``ensure_image`` runs the image build this installation carries (SOURCE/images/build.sh, package data
when installed: no checkout needed) and warns when the image's code digest label differs from
this installation's code; ``check_image`` probes another image (``--image``) for what every node needs.
"""
from __future__ import annotations

import os
import subprocess
import sys

from simcluster.launcher.docker import images
from simcluster.launcher.job import files
from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import IMAGE, LABEL
from simcluster.core.errors import ConfigError

NODE_MODULE = "simcluster.launcher.container.node"  # what every node runs


def build_image(force: bool = False) -> None:
    """Run this installation's images/build.sh with this interpreter (its code goes into the image).

    Raises:
        LauncherError: the build failed.
    """
    script = os.path.join(files.IMAGES, "build.sh")
    env = {**os.environ, "PYTHON": sys.executable}
    if subprocess.run(["bash", script, *(["--force"] if force else [])], cwd=files.SOURCE, env=env).returncode != 0:
        raise LauncherError(f"{script} failed; see its output above")


def image_state(image: str) -> tuple[bool, str]:
    """(whether image holds this installation's code, by its io.simcluster.code-digest label; a line saying so)."""
    labels, want = images.image_labels(image), files.code_digest()
    if labels is None:
        return False, f"{image} is missing; build it: simcluster build"
    have = labels.get(LABEL + "code-digest")
    if have != want:
        return False, (f"{image} holds other code (digest {have[:12] if have else 'none'}, this installation's "
                       f"{want[:12]}); rebuild it: simcluster build")
    return True, f"{image} holds this installation's code ({want[:12]})"


def cache_key() -> str:
    """``simcluster-image-VERSION-HASH``: the image of this installation (its version; the hash of its
    code digest, Dockerfile and requirements.txt), the key of a CI cache of ``docker save``."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256(files.code_digest().encode())
    for name in ("Dockerfile", "requirements.txt"):
        with open(os.path.join(files.IMAGES, name), "rb") as fh:
            h.update(fh.read())
    pyproject = os.path.join(files.SOURCE, "pyproject.toml")
    if os.path.isfile(pyproject):  # a checkout: its own version, whatever metadata lies about
        import tomllib

        with open(pyproject, "rb") as fh:
            ours = tomllib.load(fh)["project"]["version"]
    else:
        try:
            ours = version("simcluster")
        except PackageNotFoundError:
            ours = "unknown"
    return f"simcluster-image-{ours}-{h.hexdigest()[:16]}"


def ensure_image(image: str, build: bool, mount_code: bool = False) -> None:
    """Build the trainer image if it is missing (or build is set); warn when the image's code (its
    io.simcluster.code-digest label) differs from this installation's (unless mount_code).

    Raises:
        LauncherError: the build failed.
    """
    if images.image_labels(image) is not None and not build:
        if not mount_code and not image_state(image)[0]:
            print(f"launcher: WARNING: this installation's train/ or launcher/ code ({files.SOURCE}) differs from "
                  f"the copy in {image}; the containers run the image's copy. Use --build (rebuild) or --mount-code "
                  f"(mount this code).", file=sys.stderr, flush=True)
        return
    print(f"launcher: building {image} with {os.path.join(files.IMAGES, 'build.sh')}", flush=True)
    build_image()


def check_image(launch: Launch) -> None:
    """A short probe container: the image has python, torch and the launcher's container side
    (and the module, when it comes from the image). Only for images other than the trainer's,
    or modules from the image.

    Raises:
        ConfigError: something is missing, naming the image and the fix.
    """
    from_image = [launch.module] if launch.train is None and launch.module and not launch.code_dir else []
    if launch.node.image == IMAGE and not from_image:
        return
    volumes = [f"{src}:{dst}:ro" for src, dst in files.code_mounts()] if launch.node.mount_code else []
    problem = images.probe_image(launch.node.image, ["torch", NODE_MODULE, *from_image], volumes, launch.node.user)
    if problem:
        raise ConfigError(f"image: {launch.node.image}: {problem}. Every node runs `python -m {NODE_MODULE}`"
                          f" and the job with torch: use an image FROM {IMAGE}, or install torch==2.13.0 and this "
                          f"project's wheel into yours (docs/own-code.md, \"Your own image\")"
                          + (f"; or check --module {from_image[0]}" if from_image else ""))
