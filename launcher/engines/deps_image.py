"""Your code's dependencies: wheels downloaded on the host for the image's Python, a derived image built
FROM the trainer image, its tag the content of what it adds.

    python -c "from simcluster.launcher.engines.deps_image import PLATFORM; print(' '.join(PLATFORM))"
    python -m launcher up --nodes 2 --nproc-per-node 2 --script train.py --requirements requirements.txt -- --steps 8

The rules (torchx's workspace image, Kubeflow's ``packages_to_install``, Ray's ``runtime_env``, as
one flag):

- The containers stay offline: ``pip download`` runs on the host, for the image's interpreter and
  platform (PLATFORM: CPython 3.11, manylinux x86-64, binary wheels only), with every package the
  image holds pinned to the version it holds (a constraints file of the image's installed distributions).
  So a framework resolves against the image's torch==2.13.0+cpu and never pulls a CUDA torch or its
  nvidia wheels, and a package the image has is never replaced.
- torch and what torch itself requires stay fixed (torch at the image's version, each of torch's
  requirements within torch's own specifier); the other packages of the image stay too, unless the
  requirements cannot resolve with them: then pip resolves again with only the fixed ones, and the
  packages that move (an older fsspec for a stack on datasets or transformers 4.x) are installed
  over the image's and named; the image's packages the added ones require and that stay are named as
  held (``held_for``), since pip picked releases that work with them, however old. A requirement that cannot be had, or that clashes with a fixed one, is
  refused before any container starts: ConfigError naming pip's own reason, the line it is about, and
  the package and constraint that clash. A package built against torch (TORCH_BUILT: torchvision,
  torchaudio, ...) must come as the image's torch's build (2.13.0+cpu: its ``+cpu`` wheel from the PyTorch
  CPU index), else it is refused naming both.
- The derived image is ``simcluster/deps:<key>``, key = sha256 of the base image's id, the
  requirements file's bytes and each ``--wheel``'s name and bytes: the same inputs build nothing a
  second time (nothing is downloaded either). Its labels name the base, the wheels installed and the
  packages moved. The key covers every file the requirements file includes (``-r``, ``-c``).
- Only wheels the image lacks (or holds at another version) are installed (``pip install --no-index --no-deps``), as root in the
  build, their bytecode compiled there: the containers never write it (PYTHONDONTWRITEBYTECODE, a
  read-only root), so each rank would compile a framework's sources again at every import (minutes of
  CPU for torchtitan's stack on 8 ranks). The image's user stays the trainer image's.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

from simcluster.launcher.container.layout import IMAGE, IMAGE_USER, LABEL
from simcluster.launcher.docker import images
from simcluster.launcher.job import pip_errors
from simcluster.launcher.job.deps import WHEEL, Requirements, read_lines
from simcluster.launcher.job.launch import Launch
from simcluster.core.errors import ConfigError

PLATFORM = ("--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
            "--platform", "manylinux_2_17_x86_64")  # the trainer image's interpreter (images/build.sh's wheelhouse)


def _norm(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


PROBE = ("import importlib.metadata as m, json; from pip._vendor.packaging.requirements import Requirement as R; "
         "rs = [R(r) for r in m.requires('torch') or []]; "
         "print(json.dumps([{d.metadata['Name']: d.version for d in m.distributions()}, "
         "[r.name + str(r.specifier) for r in rs if r.marker is None or r.marker.evaluate({'extra': ''})]]))")


def image_packages(base: str) -> tuple[dict[str, str], dict[str, str]]:
    """({name: version} of every distribution in the image, {name: constraint} of what stays fixed: torch
    at its version and each requirement of torch's own (markers evaluated in the image)). Raises
    LauncherError."""
    held, torch_needs = json.loads(images.run_once(base, ["python", "-c", PROBE]).strip().splitlines()[-1])
    held = {_norm(name): version for name, version in held.items()}
    fixed = {"torch": f"torch=={held['torch']}"} if "torch" in held else {}
    for spec in torch_needs:
        name = _norm(re.match(r"[A-Za-z0-9._-]+", spec).group(0))
        fixed.setdefault(name, name + spec[len(re.match(r"[A-Za-z0-9._-]+", spec).group(0)):])
    return held, fixed


def _pip(req: Requirements, constraints: list[str], dest: str) -> subprocess.CompletedProcess:
    """One ``pip download`` of req into dest for the image's platform, under the given constraint lines."""
    path = os.path.join(dest, ".constraints.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(f"{line}\n" for line in constraints)
    wanted = (["-r", os.path.abspath(req.file)] if req.file else []) + [os.path.abspath(w) for w in req.wheels]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--progress-bar", "off", "--no-input", "--retries",
                           "2", "-d", dest, "-c", path, *PLATFORM, *wanted],  # not -q: it hides a conflict's cause
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.remove(path)
    return proc


RESOLVE = ("Could not find a version", "No matching distribution", "conflict")


def download(req: Requirements, held: dict[str, str], fixed: dict[str, str], dest: str) -> dict[str, str]:
    """pip download of the requirements and wheels into dest, for the image's platform. First with every
    package the image holds pinned; when that cannot resolve, again with only torch and what torch
    requires fixed, so a package torch does not pin may move. Returns {name: new version} of the packages
    of the image that move ({} when none). Raises ConfigError naming pip's reason, the line it is about,
    and the package and constraint that clash."""
    lines = read_lines(req.file) if req.file else ()
    proc = _pip(req, [f"{n}=={v}" for n, v in sorted(held.items())], dest)
    if proc.returncode != 0 and any(k in proc.stdout for k in RESOLVE):
        for name in os.listdir(dest):
            os.remove(os.path.join(dest, name))
        proc = _pip(req, sorted(fixed.values()), dest)
    if proc.returncode == 0:
        found = {_norm(m["name"]): m["version"] for m in map(WHEEL.match, os.listdir(dest)) if m}
        torch_builds(found, held, lines)
        return {n: v for n, v in sorted(found.items()) if n in held and held[n] != v}
    why = pip_errors.reason(proc.stdout, pip_errors.locations(lines))
    line = pip_errors.named_line(why, lines)
    where = f" ({line.where()})" if line else ""
    if (conflict := pip_errors.clash(why, fixed)) is not None:
        raise ConfigError(f"requirements: {conflict}{where}; pip: {why}; loosen or drop that requirement "
                          f"(torch and what torch requires stay as the image has them)")
    fix = ("fix that location (an index that answers, a folder that exists), or drop the line"
           if line and pip_errors.LOCATION_LINE.match(line.text) else
           "fix its name or version (a binary wheel for cp311 manylinux x86-64 must exist), or drop it"
           if "No matching distribution" in why and ";" not in why else "fix that line, or drop it")
    raise ConfigError(f"requirements: pip cannot download for the image's Python (cp311, manylinux x86-64, "
                      f"wheels only){where}: {why}; {fix}")


# packages whose wheels hold code compiled against one torch build: each must be the image's torch's build
TORCH_BUILT = ("torchvision", "torchaudio", "torchtext", "torchrec", "torchcodec", "torchao", "fbgemm-gpu", "xformers",
               "flash-attn", "torch-scatter", "torch-sparse", "torch-cluster", "torch-spline-conv")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # the PyTorch index of the CPU builds (+cpu local versions)


def torch_builds(found: dict[str, str], held: dict[str, str], lines) -> None:
    """A package built against torch (TORCH_BUILT) downloaded for another build than the image's torch
    (PyPI's Linux torchvision is built against a CUDA torch; the image's is 2.13.0+cpu) is refused,
    naming both, before anything is built: installed beside the image's torch it fails at import.

    Raises:
        ConfigError: naming the package's version, the image's torch and the fix (its CPU build).
    """
    torch = held.get("torch")
    if torch is None:
        return
    build = torch.partition("+")[2]
    for name in TORCH_BUILT:
        version = found.get(name)
        if version is None or version.partition("+")[2] == build:
            continue
        line = pip_errors.named_line(name, tuple(lines))
        where = f" ({line.where()})" if line else ""
        their = f"its {version.partition('+')[2]} build" if "+" in version else "PyPI's build, against a CUDA torch"
        raise ConfigError(f"requirements: {name} {version}{where} is {their}, and the image's torch is {torch}: "
                          f"installed beside it, {name} fails at import; take the build of the image's torch: add "
                          f"--extra-index-url {CPU_INDEX} to the file and pin {name}=={version.partition('+')[0]}"
                          f"{'+' + build if build else ''}")


def new_wheels(dest: str, held: dict[str, str]) -> list[str]:
    """The downloaded wheels the image lacks, or holds at another version (file names, sorted)."""
    out = []
    for name in sorted(os.listdir(dest)):
        m = WHEEL.match(name)
        if m and held.get(_norm(m["name"])) != m["version"]:
            out.append(name)
    return out


def held_for(dest: str, added: list[str], held: dict[str, str], moved: dict[str, str]) -> dict[str, list[str]]:
    """{the image's package kept at its version: the added wheels that require it}: what the resolution
    held (pip took releases of the added packages that work with it), from each wheel's METADATA."""
    import zipfile

    out: dict[str, list[str]] = {}
    for name in added:
        m = WHEEL.match(name)
        try:
            with zipfile.ZipFile(os.path.join(dest, name)) as z:
                meta = next((z.read(n).decode("utf-8", "replace") for n in z.namelist()
                             if n.endswith(".dist-info/METADATA")), "")
        except (OSError, zipfile.BadZipFile):
            continue
        for req in re.findall(r"^Requires-Dist: *([A-Za-z0-9][A-Za-z0-9._-]*)([^\n]*)$", meta, re.M):
            dep = _norm(req[0])
            if dep in held and dep not in moved and "extra ==" not in req[1]:
                out.setdefault(dep, []).append(f"{m['name']} {m['version']}")
    return dict(sorted(out.items()))


def held_text(kept: dict[str, list[str]], held: dict[str, str]) -> str:
    """``fsspec 2026.9.0 (for datasets 2.0.0), numpy 2.4.6 (for datasets 2.0.0)``: held_for's answer as text."""
    return ", ".join(f"{name} {held[name]} (for {', '.join(users)})" for name, users in kept.items())


DOCKERFILE = """FROM {base}
USER root
COPY wheels/ /tmp/wheels/
RUN python -m pip install --no-index --no-deps --no-cache-dir /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER {user}
"""


def ensure(req: Requirements, base: str = IMAGE, say=print) -> str:
    """The derived image of ``req`` over ``base``: its tag, built when missing (nothing downloaded when
    it exists). Raises ConfigError (see ``download``; nothing is built then), LauncherError (Docker)."""
    req.check()
    labels = images.image_labels(base)
    if labels is None:
        raise ConfigError(f"requirements: the base image {base} is missing; build it first: python -m launcher build")
    tag = req.tag(images.image_id(base), DOCKERFILE)
    if images.image_labels(tag) is not None:
        say(f"image: {tag} (your requirements, built before)")
        return tag
    held, fixed = image_packages(base)
    with tempfile.TemporaryDirectory(prefix="simcluster-deps-") as ctx:
        wheels = os.path.join(ctx, "wheels")
        os.mkdir(wheels)
        say(f"requirements: downloading wheels for the image's Python (cp311, manylinux x86-64) for {tag}")
        moved = download(req, held, fixed, wheels)
        added = new_wheels(wheels, held)
        kept = held_for(wheels, added, held, moved)
        for name in os.listdir(wheels):
            if name not in added:
                os.remove(os.path.join(wheels, name))
        with open(os.path.join(ctx, "Dockerfile"), "w", encoding="utf-8") as fh:
            fh.write(DOCKERFILE.format(base=base, user=IMAGE_USER) if added else f"FROM {base}\n")  # all held already
        moves = " ".join(f"{n}:{held[n]}->{v}" for n, v in moved.items())
        images.build_image(ctx, tag, labels={LABEL + "base": base, LABEL + "wheels": " ".join(added),
                                             LABEL + "moved": moves})
    names = [f"{m['name']}=={m['version']}" for m in map(WHEEL.match, added) if _norm(m["name"]) not in moved]
    say(f"image: {tag} built FROM {base}, adding {len(names)} wheel(s): {' '.join(names) or 'none'}"
        + (f"; moving {', '.join(f'{n} {held[n]} -> {v}' for n, v in moved.items())} (torch does not pin "
           f"{'them' if len(moved) > 1 else 'it'})" if moved else "")
        + (f"; holding the image's {held_text(kept, held)}: "
           f"pip took the releases that work with them (pin a newer one in your file to move them instead)"
           if kept else ""))
    return tag


def with_image(launch: Launch, say=print) -> Launch:
    """The launch with its nodes' image the derived image of its requirements (built when missing); the
    launch itself when it has none. Raises ConfigError, LauncherError (see ``ensure``)."""
    if not launch.requirements:
        return launch
    tag = ensure(launch.requirements, launch.node.image, say)
    return dataclasses.replace(launch, node=dataclasses.replace(launch.node, image=tag))
