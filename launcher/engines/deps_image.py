"""Your code's dependencies: wheels downloaded on the host for the image's Python, a derived image built
FROM the trainer image, its tag the content of what it adds.

    python -c "from simcluster.launcher.engines.deps_image import PLATFORM; print(' '.join(PLATFORM))"
    python -m launcher up --nodes 2 --nproc-per-node 2 --script train.py --requirements requirements.txt -- --steps 8

The rules (torchx's workspace image, Kubeflow's ``packages_to_install``, Ray's ``runtime_env``, as
one flag):

- The containers stay offline: ``pip download`` runs on the host, for the image's interpreter and
  platform (PLATFORM: CPython 3.11, manylinux x86-64, binary wheels only), with every package the
  image holds pinned to the version it holds (a constraints file of the image's own ``pip freeze``).
  So a framework resolves against the image's torch==2.13.0+cpu and never pulls a CUDA torch or its
  nvidia wheels, and a package the image has is never replaced.
- A requirement that cannot be had, or that would change a package of the image (torch first among
  them), is refused before any container starts: ConfigError naming the package and pip's reason.
- The derived image is ``simcluster/deps:<key>``, key = sha256 of the base image's id, the
  requirements file's bytes and each ``--wheel``'s name and bytes: the same inputs build nothing a
  second time (nothing is downloaded either). Its labels name the base and the wheels installed.
- Only wheels the image lacks are installed (``pip install --no-index --no-deps``), as root in the
  build; the image's user stays the trainer image's.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile

from simcluster.launcher.container.layout import IMAGE, IMAGE_USER, LABEL
from simcluster.launcher.docker import images
from simcluster.launcher.job.deps import WHEEL, Requirements
from simcluster.launcher.job.launch import Launch
from simcluster.train.errors import ConfigError

PLATFORM = ("--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
            "--platform", "manylinux_2_17_x86_64")  # the trainer image's interpreter (images/build.sh's wheelhouse)


def _norm(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(base: str) -> dict[str, str]:
    """{name: version} of every distribution in the image (its ``pip freeze``). Raises LauncherError."""
    out = images.run_once(base, ["python", "-m", "pip", "freeze", "--all"])
    pins = [line.split("==", 1) for line in out.splitlines() if "==" in line]
    return {_norm(name): version for name, version in pins}


def download(req: Requirements, held: dict[str, str], dest: str) -> None:
    """pip download of the requirements and wheels into dest, for the image's platform, every package the
    image holds pinned. Raises ConfigError naming the package pip could not have, or would change."""
    constraints = os.path.join(dest, ".constraints.txt")
    with open(constraints, "w", encoding="utf-8") as fh:
        fh.writelines(f"{name}=={version}\n" for name, version in sorted(held.items()))
    wanted = (["-r", os.path.abspath(req.file)] if req.file else []) + [os.path.abspath(w) for w in req.wheels]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-input", "-d", dest, "-c", constraints,
                           *PLATFORM, *wanted], capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        why = "; ".join(errors) or proc.stderr.strip()[-600:]
        changed = sorted(name for name in held if re.search(rf"\b{re.escape(name)}==", why, re.I))
        if "conflict" in why.lower() and changed:
            raise ConfigError(f"requirements: would change {', '.join(changed)} of the trainer image "
                              f"(torch=={held.get('torch', '?')} and the rest stay as the image has them); pip: "
                              f"{why}; drop or loosen that requirement")
        missing = re.findall(r"for (\S+)", why)
        raise ConfigError(f"requirements: pip cannot have {missing[0] if missing else 'a requirement'} for the "
                          f"image's Python (cp311, manylinux x86-64, wheels only): {why}; fix its name or version "
                          f"(a binary wheel for that Python must exist), or drop it")


def new_wheels(dest: str, held: dict[str, str]) -> list[str]:
    """The downloaded wheels the image lacks (file names, sorted)."""
    out = []
    for name in sorted(os.listdir(dest)):
        m = WHEEL.match(name)
        if m and _norm(m["name"]) not in held:
            out.append(name)
    return out


DOCKERFILE = """FROM {base}
USER root
COPY wheels/ /tmp/wheels/
RUN python -m pip install --no-index --no-deps --no-cache-dir --no-compile /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER {user}
"""


def ensure(req: Requirements, base: str = IMAGE, say=print) -> str:
    """The derived image of ``req`` over ``base``: its tag, built when missing (nothing downloaded when
    it exists). Raises ConfigError (see ``download``; nothing is built then), LauncherError (Docker)."""
    req.check()
    labels = images.image_labels(base)
    if labels is None:
        raise ConfigError(f"requirements: the base image {base} is missing; build it first: python -m launcher build")
    tag = req.tag(images.image_id(base))
    if images.image_labels(tag) is not None:
        say(f"image: {tag} (your requirements, built before)")
        return tag
    held = image_packages(base)
    with tempfile.TemporaryDirectory(prefix="simcluster-deps-") as ctx:
        wheels = os.path.join(ctx, "wheels")
        os.mkdir(wheels)
        say(f"requirements: downloading wheels for the image's Python (cp311, manylinux x86-64) for {tag}")
        download(req, held, wheels)
        added = new_wheels(wheels, held)
        for name in os.listdir(wheels):
            if name not in added:
                os.remove(os.path.join(wheels, name))
        with open(os.path.join(ctx, "Dockerfile"), "w", encoding="utf-8") as fh:
            fh.write(DOCKERFILE.format(base=base, user=IMAGE_USER) if added else f"FROM {base}\n")  # all held already
        images.build_image(ctx, tag, labels={LABEL + "base": base, LABEL + "wheels": " ".join(added)})
    names = [f"{m['name']}=={m['version']}" for m in map(WHEEL.match, added)]
    say(f"image: {tag} built FROM {base}, adding {len(added)} wheel(s): {' '.join(names) or 'none'}")
    return tag


def with_image(launch: Launch, say=print) -> Launch:
    """The launch with its nodes' image the derived image of its requirements (built when missing); the
    launch itself when it has none. Raises ConfigError, LauncherError (see ``ensure``)."""
    if not launch.requirements:
        return launch
    tag = ensure(launch.requirements, launch.node.image, say)
    return dataclasses.replace(launch, node=dataclasses.replace(launch.node, image=tag))
