"""Host paths and files of the launcher: where its own code and image build are (SOURCE), where runs go
(ROOT), paths as the compose files name them, atomic writes and run folders.

    python -c "from simcluster.launcher.job.files import ROOT, SOURCE, repo_path; print(SOURCE, ROOT, repo_path('runs/x'))"
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile

from simcluster.launcher.container.layout import APP_DIR, IMAGE_USER, RUN_DIR_MODE
from simcluster.core.runlog import write_job

PACKAGE = os.path.dirname(os.path.abspath(sys.modules["simcluster"].__file__))  # simcluster/ (its __init__)
# SOURCE: the folder holding launcher/, train/ and images/. Installed with pip they are inside the
# package; in a checkout they are the checkout's top-level folders, which simcluster/launcher and
# simcluster/train link to.
CHECKOUT = os.path.islink(os.path.join(PACKAGE, "launcher"))
SOURCE = os.path.dirname(PACKAGE) if CHECKOUT else PACKAGE
# ROOT: where runs/ and compose/ are made: the checkout's root, or (installed) the folder the
# launcher is started in. Never taken for the source tree: an installed launcher reads its own code
# and image build from SOURCE, whatever train/ or launcher/ folders the user's project holds.
ROOT = SOURCE if CHECKOUT else os.getcwd()
IMAGES = os.path.join(SOURCE, "images")  # Dockerfile, build.sh, requirements.txt (package data when installed)
CODE_FOLDERS = ("launcher", "train")  # the code the trainer image holds, under APP_DIR/simcluster/ (with simcluster/core)


def run_name(run_dir: str) -> str:
    """Basename of a run folder: its mount name, the rendezvous id and the compose project's
    suffix (``runs/x/`` -> ``x``). Empty for a path with no folder name."""
    parts = [p for p in str(run_dir).replace("\\", "/").split("/") if p not in ("", ".")]
    return "" if not parts or parts[-1] == ".." else parts[-1]


def code_sources() -> dict[str, str]:
    """This installation's code as the trainer image holds it: path under APP_DIR (``simcluster/...``)
    -> host path. images/build.sh stages these into the image; ``--mount-code`` mounts them over it."""
    out = {f"simcluster/{f}": os.path.join(PACKAGE, f) for f in ("__init__.py", "__main__.py", "core")}
    out.update({f"simcluster/{d}": os.path.join(SOURCE, d) for d in CODE_FOLDERS})
    return out


def code_mounts() -> list[tuple[str, str]]:
    """(host path, container path) pairs for ``--mount-code``: this installation's code over the image's."""
    return [(host, f"{APP_DIR}/{name}") for name, host in code_sources().items()]


def code_digest(sources: dict[str, str] | None = None) -> str:
    """sha256 (hex) of the .py and .cpp files of ``code_sources()``: their image paths and bytes, in sorted
    order (so a checkout and an installed package of the same code agree). images/build.sh labels
    the trainer image with it (io.simcluster.code-digest), so `launcher up` can tell whether the
    image holds this installation's code (content, not mtimes: a build from the layer cache keeps
    the old creation time)."""
    h = hashlib.sha256()
    files = {}
    for name, host in (code_sources() if sources is None else sources).items():
        if os.path.isfile(host):
            files[name] = host
            continue
        for base, dirs, names in os.walk(host):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in names:
                if f.endswith((".py", ".cpp")):
                    path = os.path.join(base, f)
                    files[name + "/" + os.path.relpath(path, host).replace(os.sep, "/")] = path
    for name in sorted(files):
        h.update(name.encode() + b"\0")
        with open(files[name], "rb") as fh:
            h.update(fh.read() + b"\0")
    return h.hexdigest()


def stage_code(dest: str) -> None:
    """Copy ``code_sources()`` (every file but bytecode and __pycache__) into dest as dest/simcluster/...:
    the image build's context. (code_digest hashes the .py and .cpp files of the same sources.)"""
    import shutil

    for name, host in code_sources().items():
        target = os.path.join(dest, name)
        if os.path.isfile(host):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(host, target)
        else:
            shutil.copytree(host, target, ignore=lambda d, names: [n for n in names if n == "__pycache__"
                                                                    or n.endswith((".pyc", ".pyo"))])


def repo_path(path: str, root: str = ROOT) -> str:
    """A user path (relative to the cwd) as the repo-relative POSIX path when inside the repo,
    else absolute."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full, root)
    inside = rel != ".." and not rel.startswith(".." + os.sep) and not os.path.isabs(rel)
    return rel.replace(os.sep, "/") if inside else full


def host_abspath(path: str, root: str = ROOT) -> str:
    """A repo-relative or absolute path (as a Launch holds it) made absolute."""
    return path if os.path.isabs(path) else os.path.join(root, path)


def project_dir_for(out_path: str, root: str = ROOT) -> str:
    """Path from the folder of out_path to the repo root: "." , "..", "../.." or absolute."""
    folder = os.path.dirname(os.path.abspath(out_path))
    if repo_path(folder, root).startswith("/"):
        return root
    return os.path.relpath(root, folder).replace(os.sep, "/")


def write_atomic(path: str, text: str) -> None:
    """Write text to path via a temp file in the same folder + os.replace (no partial files)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def container_user() -> str:
    """``UID:GID`` the containers of ``launcher up`` run as: the invoking user's, so the outputs
    are theirs; the image's own user (1000:1000) when the launcher runs as root."""
    uid, gid = os.getuid(), os.getgid()
    return IMAGE_USER if uid == 0 else f"{uid}:{gid}"


def make_run_dir(path: str, user: str, job: dict | None = None) -> None:
    """Create the run folder (mode RUN_DIR_MODE) owned by the containers' user ``UID:GID``
    (a chown only when running as root; otherwise the user is the invoking one), and write the job's
    record there (RUN_DIR/job.json: Launch.record(), simcluster/core/runlog.py) when given. A folder that was
    there before, not empty and no run folder (no job.json, cluster.log or compose.yml: a folder of the user's)
    keeps its owner and mode: the containers' user must be able to write it (the node checks, and
    says so)."""
    ours = not os.path.isdir(path) or not os.listdir(path) or any(
        os.path.exists(os.path.join(path, f)) for f in ("job.json", "cluster.log", "compose.yml", "stack.yml"))
    os.makedirs(path, exist_ok=True)
    if job is not None:
        write_job(path, job)
    if not ours:
        return
    os.chmod(path, RUN_DIR_MODE)
    if os.getuid() == 0:
        uid, gid = (int(x) for x in user.split(":"))
        os.chown(path, uid, gid)
