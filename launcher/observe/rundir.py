"""The one reader of a run folder: metrics.jsonl (whole, growing, or its last step), the newest run.

    python -c "from simcluster.launcher.observe.rundir import read_metrics; print(read_metrics('runs/mesh-2x2x2')[-1])"

A run folder (``runs/<name>``, mounted at /runs/<name> in every container) holds ``metrics.jsonl``
(one JSON object per step, the schema of train/metrics.py), ``cluster.log``, ``traffic/``,
``trace.json``, ``report/`` and ``checkpoints/``. Every part of this project that reads
metrics.jsonl (progress, summary, report, chaos, status, parity, benchmarks) reads it here.
Stdlib only (the trainer's ranks import it too). Lines that are not a JSON object, such as the last
line of a run killed mid-write, are skipped unless ``strict``.
"""
from __future__ import annotations

import glob
import json
import os
import re

from simcluster.train.config import ConfigError

METRICS = "metrics.jsonl"
TRACE = "trace.json"
CLUSTER_LOG = "cluster.log"  # every line `launcher up` showed, its summary last


def _rows(data: bytes, path: str, strict: bool, first_line: int = 1) -> list[dict]:
    out = []
    for n, line in enumerate(data.splitlines(), first_line):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if strict:
                raise ConfigError(f"{path} line {n} is not JSON; fix or delete that line") from None
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def read_metrics(run_dir: str, name: str = METRICS, since: float = 0.0, strict: bool = False) -> list[dict]:
    """The step records of a run folder, in file order; [] when the file is missing or was last
    written before ``since`` (UNIX s: a previous run's file in a reused folder).

    Raises:
        ConfigError: strict and a line is not JSON (naming the file and line).
    """
    path = os.path.join(run_dir, name)
    try:
        if os.path.getmtime(path) < since:
            return []
        with open(path, "rb") as fh:
            return _rows(fh.read(), path, strict)
    except FileNotFoundError:
        return []


def last_step(run_dir: str | None, since: float = 0.0) -> int | None:
    """The ``step`` of the last complete row of RUN_DIR/metrics.jsonl written since ``since``, or None."""
    path = os.path.join(run_dir or "", METRICS)
    if not run_dir or not os.path.isfile(path) or os.path.getmtime(path) < since:
        return None
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 4096))
        rows = _rows(fh.read(), path, strict=False)
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    return steps[-1] if steps else None


def last_summary(run_dir: str | None) -> tuple[float, str | None] | None:
    """(UNIX time RUN_DIR/cluster.log was last written, its last ``== summary: OK|FAILED ==``
    line or None), or None without a cluster.log: when and how the folder's last `up` ended."""
    path = os.path.join(run_dir or "", CLUSTER_LOG)
    if not run_dir or not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 65536))
        lines = fh.read().decode("utf-8", "replace").splitlines()
    return os.path.getmtime(path), next((ln.strip() for ln in reversed(lines) if ln.startswith("== summary:")), None)


class MetricsTail:
    """New complete rows of a metrics.jsonl as it grows (a rewritten, shorter file is read anew).
    A file last written before ``since`` (UNIX time; a previous run's, in a reused run folder)
    gives no rows until this run's job writes it."""

    def __init__(self, run_dir: str, since: float = 0.0):
        self.path, self.offset, self.since = os.path.join(run_dir, METRICS), 0, since

    def rows(self) -> list[dict]:
        """The rows completed since the last call."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_mtime < self.since:  # not written by this run yet
            return []
        if st.st_size < self.offset:  # rewritten (a resume keeps the steps up to its checkpoint)
            self.offset = 0
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return _rows(data[:end], self.path, strict=False)


def newest_run(root: str) -> str:
    """The folder under ROOT/runs whose metrics.jsonl changed last.

    Raises:
        ConfigError: none has one, naming the fix.
    """
    found = glob.glob(os.path.join(root, "runs", "**", METRICS), recursive=True)
    if not found:
        raise ConfigError(f"report: no run with a metrics.jsonl under {os.path.join(root, 'runs')}; "
                          f"run one first (python -m launcher up ...) or pass --run-dir DIR")
    return os.path.dirname(max(found, key=os.path.getmtime))


_RANK_LINE = re.compile(r"^node-\d+ r(\d+)\s*\| (.*)$")  # observe/follow.py Stream.handle's prefix


def rank_lines(run_dir: str) -> list[tuple[int, str]]:
    """(rank, text) of each line a rank printed, from RUN_DIR/cluster.log in order: the text as the
    rank printed it (the ``node-K rR |`` prefix taken off); [] without a cluster.log."""
    try:
        with open(os.path.join(run_dir, CLUSTER_LOG), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    return [(int(m.group(1)), m.group(2)) for line in lines if (m := _RANK_LINE.match(line))]


def summary_lines(run_dir: str) -> list[str]:
    """The lines of RUN_DIR/cluster.log's last summary, from its ``== summary: OK|FAILED ==`` line
    on; [] without one."""
    try:
        with open(os.path.join(run_dir, CLUSTER_LOG), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    start = max((i for i, line in enumerate(lines) if line.startswith("== summary:")), default=None)
    return [] if start is None else lines[start:]
