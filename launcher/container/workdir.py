"""The run folder as a node sees it (writable?); your code's working directory, as on a cluster's shared
filesystem: writable, shared by every node of the run, the files beside the script readable through it;
and the run folder's record of the code that ran.

    python -m simcluster.launcher.container.workdir /code /tmp/run/work /tmp/run     # (in a node, by the wrapper)

The rules (docs/own-code.md, "Your working directory"):

- WORK (``RUN_DIR/work``, container/layout.py WORK_DIR; Launch.workdir) is every rank's working directory, on every node: a relative write of any
  rank (a DCP checkpoint of all ranks, a log file) lands in the run folder, as it lands in the shared
  working directory of a real cluster's job.
- Each top-level entry of the code folder (``/code``, mounted read-only) is linked into WORK by the
  same name (``work/data.txt -> /code/data.txt``), so a relative read of a file beside the script
  works, and the user's own folder is never written (the link's target is read-only).
- Node-local paths stay per node (``/tmp``, the home folder ``/tmp``): code that wrongly takes them
  for shared fails here as on a cluster.
- The run folder keeps the code that ran: ``RUN_DIR/code/`` is a copy of the code folder (without
  ``__pycache__``, ``.git`` and run folders: a ``runs/`` inside the project holds this run's own
  folder too) when it holds at most COPY_LIMIT bytes, else ``RUN_DIR/code.sha256`` lists every file with its size and
  sha256 (and says why). Made by node 0 at each new `up` into the folder (an earlier run's record
  is replaced, its stale links removed from WORK), kept across the launcher's restarts of one run.
- The record is cheap whatever the folder holds (a data set, a checkpoint beside the script): it reads
  at most COPY_LIMIT bytes to copy, or HASH_BUDGET bytes to hash, and stats at most MAX_FILES files.
  A file above HASH_FILE_LIMIT, or past the budget, is listed with its size and ``-`` for its hash;
  files past MAX_FILES are not listed. Its line says what it left out. It is written beside its
  place (``.partial``) and moved there whole; a stale ``.partial`` of a run cut short is removed.
  The node wrapper makes it after its heartbeat has started (launcher/container/node.py).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile


CODE_COPY = "code"  # RUN_DIR/CODE_COPY: the copy of the code that ran
CODE_LIST = "code.sha256"  # RUN_DIR/CODE_LIST: instead, above COPY_LIMIT: "sha256  size  path" a file
COPY_LIMIT = 20 * 2**20  # bytes of code copied into the run folder (above: listed with hashes)
HASH_FILE_LIMIT = 8 * 2**20  # a listed file above this many bytes is not hashed (a data set, a checkpoint)
HASH_BUDGET = 64 * 2**20  # bytes hashed at most for one listing; the files after are listed unhashed
MAX_FILES = 20_000  # files stat'ed at most (a data set of many small files); the rest are not listed
SKIP = ("__pycache__", ".git")  # never copied nor listed, nor a run folder inside the code folder
RUN_MARKERS = ("cluster.log", "job.json")  # a folder holding one is a run folder (simcluster/core/runlog.py)


def check_writable(run_dir: str) -> str | None:
    """None if this process can create files in run_dir (made if missing), else a message with the fix."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
        return None
    except OSError as e:
        try:
            st = os.stat(run_dir)
            owner = f"owner uid {st.st_uid}, mode {oct(st.st_mode & 0o7777)}"
        except OSError:
            owner = "missing"
        host = os.environ.get("SIMCLUSTER_HOST_RUN_DIR") or "the host folder mounted there"
        return (f"run folder {run_dir} is not writable by uid {os.getuid()} ({owner}: {e.strerror}). "
                f"Fix on the host: chown {os.getuid()}:{os.getgid()} {host} (before `docker compose up`), "
                f"or start the cluster with `python -m launcher up`, which creates it for its containers' user.")


def _is_run_folder(path: str, run_dir: str) -> bool:
    """A run folder inside the code folder: this run's own (the same folder, mounted twice: /code/runs/x
    is /runs/x) or any other (it holds a cluster.log or a job.json): never copied nor listed."""
    try:
        if os.path.samefile(path, run_dir):
            return True
    except OSError:
        pass
    return any(os.path.isfile(os.path.join(path, f)) for f in RUN_MARKERS)


def _skipped(base: str, names: list[str], run_dir: str) -> set[str]:
    """The names under base that are neither copied nor listed: SKIP, what this user cannot read (a
    folder the containers' user may not enter, as the ranks could not either), and run folders."""
    out = set()
    for n in names:
        path = os.path.join(base, n)
        folder = os.path.isdir(path) and not os.path.islink(path)
        if n in SKIP or not os.access(path, os.R_OK | (os.X_OK if folder else 0)) or \
                (folder and _is_run_folder(path, run_dir)):
            out.add(n)
    return out


def _files(code_dir: str, run_dir: str, most: int | None = None) -> tuple[list[tuple[str, int]], bool]:
    """((path relative to code_dir, size) of every file below it, sorted; SKIP and run folders left out,
    links not followed; whether it stopped at ``most`` files, default MAX_FILES)."""
    most = MAX_FILES if most is None else most
    out = []
    for base, dirs, names in os.walk(code_dir):
        dirs[:] = sorted(set(dirs) - _skipped(base, dirs, run_dir))
        for name in sorted(set(names) - _skipped(base, names, run_dir)):
            path = os.path.join(base, name)
            if os.path.isfile(path) and not os.path.islink(path):
                if len(out) == most:
                    return out, True
                out.append((os.path.relpath(path, code_dir), os.path.getsize(path)))
    return out, False


def link(code_dir: str, work: str) -> None:
    """Make WORK and link each top-level entry of code_dir into it (several nodes may race: an existing
    link is kept); a link into code_dir whose entry is gone (an earlier run's code in this folder) is
    removed."""
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        path = os.path.join(work, name)
        if os.path.islink(path) and os.readlink(path).startswith(code_dir + "/") and not os.path.lexists(
                os.path.join(code_dir, name)):
            try:
                os.remove(path)
            except FileNotFoundError:  # another node removed it first
                pass
    for name in sorted(os.listdir(code_dir)):
        if name in SKIP:
            continue
        try:
            os.symlink(os.path.join(code_dir, name), os.path.join(work, name))
        except FileExistsError:
            pass


def record(code_dir: str, run_dir: str, fresh: bool = True, limit: int = COPY_LIMIT) -> str:
    """The run folder's record of the code that ran (a copy, or the list above ``limit`` bytes); the line
    that says which. fresh: a new `up` into the folder (the record of an earlier run is replaced);
    else a restart of the same run (SIMCLUSTER_RESTART_COUNT > 0), which keeps the record it has."""
    copy, listing = os.path.join(run_dir, CODE_COPY), os.path.join(run_dir, CODE_LIST)
    if not fresh and (os.path.exists(copy) or os.path.exists(listing)):
        return f"code: recorded before in {copy if os.path.exists(copy) else listing}"
    for stale in (copy, copy + ".partial"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in (listing, listing + ".partial"):
        if os.path.exists(stale):
            os.remove(stale)
    files, cut = _files(code_dir, run_dir)
    total = sum(size for _, size in files)
    if total <= limit and not cut:
        tmp = copy + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(code_dir, tmp, symlinks=True, ignore=lambda base, names: _skipped(base, names, run_dir))
        os.replace(tmp, copy)
        return f"code: {len(files)} files ({total} bytes) copied to {copy}"
    budget, unhashed = HASH_BUDGET, []
    with open(listing + ".partial", "w", encoding="utf-8") as fh:
        fh.write(f"# {len(files)} files, {total} bytes: above the copy limit of {limit} bytes, listed, not copied"
                 + (f"; listing stopped at {MAX_FILES} files" if cut else "") + "\n")
        for rel, size in files:
            if size > HASH_FILE_LIMIT or size > budget:  # never read unbounded bytes: sized, not hashed
                unhashed.append(rel)
                fh.write(f"-  {size}  {rel}\n")
                continue
            budget -= size
            with open(os.path.join(code_dir, rel), "rb") as src:
                digest = hashlib.file_digest(src, "sha256").hexdigest()
            fh.write(f"{digest}  {size}  {rel}\n")
    os.replace(listing + ".partial", listing)
    line = f"code: {len(files)} files ({total} bytes, above {limit}) listed with their sha256 in {listing}"
    if unhashed:
        shown = ", ".join(unhashed[:3]) + (f" and {len(unhashed) - 3} more" if len(unhashed) > 3 else "")
        line += (f"; {len(unhashed)} not hashed (above {HASH_FILE_LIMIT} bytes each, or past {HASH_BUDGET} bytes "
                 f"hashed), listed by size: {shown}")
    if cut:
        line += f"; listing stopped at {MAX_FILES} files (the rest not recorded)"
    return line


def prepare(code_dir: str, work: str, run_dir: str, first: bool) -> str | None:
    """link() on every node, and on the first node also record_line(); the record's line, or None."""
    link(code_dir, work)
    return record_line(code_dir, run_dir) if first else None


def record_line(code_dir: str, run_dir: str) -> str:
    """record() for this start (fresh unless SIMCLUSTER_RESTART_COUNT > 0), its line. A record that fails
    (a file that vanished or cannot be read mid-copy) is said in its line, never raised: the run goes
    on, as the ranks' own reads decide."""
    try:
        return record(code_dir, run_dir, fresh=os.environ.get("SIMCLUSTER_RESTART_COUNT", "0") == "0")
    except (OSError, shutil.Error) as e:
        return f"code: not recorded in the run folder ({str(e)[:300]})"


if __name__ == "__main__":
    print(prepare(sys.argv[1], sys.argv[2], sys.argv[3], first=True))
