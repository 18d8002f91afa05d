"""Host paths and files of the launcher: the repo root, paths as the compose files name them,
atomic writes and run folders.

    python -c "from launcher.files import ROOT, repo_path; print(ROOT, repo_path('runs/x'))"
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from launcher.layout import IMAGE_USER, RUN_DIR_MODE

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The repo root when running from a checkout (it has images/build.sh); installed with pip, the
# folder the launcher is started in: runs/ and compose/ are made there.
ROOT = _CHECKOUT if os.path.isfile(os.path.join(_CHECKOUT, "images", "build.sh")) else os.getcwd()


CODE_FOLDERS = ("train", "launcher")  # what images/Dockerfile copies into /app


def code_digest(root: str = ROOT) -> str:
    """sha256 (hex) of the .py files under CODE_FOLDERS: their repo-relative paths and bytes, in
    sorted order. images/build.sh labels the trainer image with it (io.simcluster.code-digest),
    so `launcher up` can tell whether the image holds this checkout's code (content, not mtimes:
    a build from the layer cache keeps the old creation time)."""
    h = hashlib.sha256()
    paths = []
    for folder in CODE_FOLDERS:
        for base, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths += [os.path.join(base, f) for f in files if f.endswith(".py")]
    for path in sorted(paths, key=lambda p: os.path.relpath(p, root)):
        h.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as fh:
            h.update(fh.read() + b"\0")
    return h.hexdigest()


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


def make_run_dir(path: str, user: str) -> None:
    """Create the run folder (mode RUN_DIR_MODE) owned by the containers' user ``UID:GID``
    (a chown only when running as root; otherwise the user is the invoking one)."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, RUN_DIR_MODE)
    if os.getuid() == 0:
        uid, gid = (int(x) for x in user.split(":"))
        os.chown(path, uid, gid)
