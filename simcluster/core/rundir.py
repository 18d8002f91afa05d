"""The one reader of a run folder: metrics.jsonl (whole, growing, or its last step), the newest run.

    python -c "from simcluster.core.rundir import read_metrics; print(read_metrics('runs/mesh-2x2x2')[-1])"

A run folder (``runs/<name>``, mounted at /runs/<name> in every container) holds ``metrics.jsonl``
(one JSON object per step, the schema of simcluster/core/metrics.py), ``cluster.log``, ``traffic/``,
``trace.json``, ``report/`` and ``checkpoints/``; the user's code adds the instruments' own
``steps/rank-R.jsonl`` (launcher/instrument/clock.py), which ``step_rows`` joins to metrics.jsonl's. Every part of this project that reads
metrics.jsonl (progress, summary, report, chaos, status, parity, benchmarks) reads it here.
Stdlib only (the trainer's ranks import it too). Lines that are not a JSON object, such as the last
line of a run killed mid-write, are skipped unless ``strict``.
"""
from __future__ import annotations

import glob
import json
import os

from simcluster.core.errors import ConfigError

METRICS = "metrics.jsonl"
STEPS = "steps"  # the instruments' step records of the user's code: steps/rank-R.jsonl (instrument/spec.py)
WORK = ".work.json"  # steps/rank-R.work.json: {"collectives": N} at a rank's end (launcher/instrument/work.py)
TRAFFIC = "traffic"  # traffic/rank-R.jsonl: one summary per step and rank (train/traffic.py)


# metrics.jsonl's typed keys (simcluster/core/metrics.py's schema), checked when read strictly
_INTS = ("step", "total_steps")
NUMBERS = ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "step_time_s")  # the built-in trainer's numbers
NOT_SERIES = ("step", "traffic", "device_peak_mb")  # a row's keys that are no series to compare (the axis, objects)
_EXAMPLE = '{"step": 3, "loss": 2.5, "step_time_s": 0.4}'


def read_json_since(path: str, since: float = 0.0):
    """The JSON document at ``path`` when this run wrote it (modified at or after ``since``, UNIX time, with
    a second's slack for coarse clocks), else None (missing, older, unreadable or not JSON)."""
    try:
        if os.path.getmtime(path) + 1 < since:
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _excerpt(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def row_problem(row) -> str | None:
    """What is wrong with one metrics.jsonl row read strictly (simcluster/core/metrics.py's schema), or None."""
    if not isinstance(row, dict):
        return f"not a JSON object but {type(row).__name__}"
    for key in _INTS:
        v = row.get(key)
        if key in row and not (isinstance(v, int) and not isinstance(v, bool)):
            return f"{key} is {v!r}, not an integer"
    for key in NUMBERS:
        v = row.get(key)
        if key in row and v is not None and not _is_number(v):
            return f"{key} is {v!r}, not a number"
    rss = row.get("rss_mb")
    if "rss_mb" in row and rss is not None and not _is_number(rss) and not (
            isinstance(rss, list) and all(_is_number(x) for x in rss)):
        return f"rss_mb is {rss!r}, not a number or a list of numbers"
    if "traffic" in row and row["traffic"] is not None and not isinstance(row["traffic"], dict):
        return f"traffic is {row['traffic']!r}, not an object"
    return None


def _rows(data: bytes, path: str, strict: bool, first_line: int = 1) -> list[dict]:
    out = []
    for n, line in enumerate(data.splitlines(), first_line):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if strict:
                cut = " (cut short: the run was killed while writing it?)" if n == len(data.splitlines()) else ""
                raise ConfigError(f"{path} line {n}: not JSON{cut}: {_excerpt(line)}; fix or delete that line, "
                                  f"e.g. {_EXAMPLE}") from None
            continue
        if strict and (why := row_problem(row)):
            raise ConfigError(f"{path} line {n}: {why}: {_excerpt(line)}; fix or delete that line, e.g. {_EXAMPLE}")
        if isinstance(row, dict):
            out.append(row)
    return out


def read_metrics(run_dir: str, name: str = METRICS, since: float = 0.0, strict: bool = False) -> list[dict]:
    """The step records of a run folder, in file order; [] when the file is missing or was last
    written before ``since`` (UNIX s: a previous run's file in a reused folder).

    Raises:
        ConfigError: strict and a line is not JSON (naming the file and line).
    """
    return _read(os.path.join(run_dir, name), since, strict)


def _read(path: str, since: float = 0.0, strict: bool = False) -> list[dict]:
    """The JSON rows of one file (read_metrics' rule: [] when missing or older than ``since``)."""
    try:
        if os.path.getmtime(path) < since:
            return []
        with open(path, "rb") as fh:
            return _rows(fh.read(), path, strict)
    except FileNotFoundError:
        return []
    except OSError as e:
        if strict:
            raise ConfigError(f"{path}: cannot be read ({e.strerror}); it should be a file of one JSON object "
                              f"per line, e.g. {_EXAMPLE}") from None
        return []


def _merged(rows: list[dict]) -> list[dict]:
    """One row per step, in order of first appearance: rows of the same step (logged by several
    ranks, or again after a restart) are merged, a later row's keys winning."""
    out: dict = {}
    for r in rows:
        if isinstance(r.get("step"), int):
            out.setdefault(r["step"], {}).update(r)
    return list(out.values())


def _rank_files(run_dir: str, folder: str) -> dict[int, str]:
    found = {}
    for path in glob.glob(os.path.join(run_dir, folder, "rank-*.jsonl")):
        tail = os.path.basename(path)[len("rank-"):-len(".jsonl")]
        if tail.isdigit():
            found[int(tail)] = path
    return dict(sorted(found.items()))


def collectives(run_dir: str, since: float = 0.0) -> dict[int, int]:
    """rank -> the collectives and point-to-point calls it made (steps/rank-R.work.json, written at
    the end of each rank of the user's code; files older than ``since`` ignored): ranks without one
    are left out (the built-in trainer, a rank killed, an engine without the instruments)."""
    found = {}
    for path in glob.glob(os.path.join(run_dir, STEPS, f"rank-*{WORK}")):
        tail = os.path.basename(path)[len("rank-"):-len(WORK)]
        rows = _read(path, since) if tail.isdigit() else []
        if rows and isinstance(rows[-1].get("collectives"), int):
            found[int(tail)] = rows[-1]["collectives"]
    return dict(sorted(found.items()))


def rank_traffic(run_dir: str, step: int, strict: bool = False) -> dict[int, dict]:
    """rank -> its traffic/rank-R.jsonl record of ``step`` (ranks that recorded it).

    Raises:
        ConfigError: strict and a line is not a JSON object of the schema (naming the file and line).
    """
    out = {}
    for rank, path in _rank_files(run_dir, TRAFFIC).items():
        for r in _merged(_read(path, strict=strict)):
            if r["step"] == step:
                out[rank] = r
    return out


def traffic_totals(run_dir: str, since: float = 0.0) -> dict[int, dict]:
    """step -> that step's traffic summed over every rank's traffic/rank-R.jsonl (the shape of
    train/traffic.py summarize: {"bytes": {kind}, "messages": {kind}, "links": {link}}), for the
    steps every rank recorded."""
    files = _rank_files(run_dir, TRAFFIC)
    per_step: dict[int, list[dict]] = {}
    for path in files.values():
        for r in _merged(_read(path, since)):
            per_step.setdefault(r["step"], []).append(r)
    out = {}
    for step, recs in sorted(per_step.items()):
        if len(recs) == len(files):
            total: dict = {"bytes": {}, "messages": {}, "links": {}}
            for rec in recs:
                for part in total:
                    for k, v in (rec.get(part) or {}).items():
                        total[part][k] = total[part].get(k, 0) + v
            out[step] = total
    return out


def step_rows(run_dir: str, since: float = 0.0, strict: bool = False) -> list[dict]:
    """The run's steps, one merged row each: metrics.jsonl's rows (rows of one step merged) joined
    with the instruments' step records of the user's code (steps/rank-R.jsonl): where metrics.jsonl
    lacks them, ``step_time_s`` (the slowest rank's), ``rss_mb`` (a list, per rank), ``device_peak_mb``
    (rank -> MiB, a simulated GPU's peak; only where ranks record it) and ``traffic``
    (every rank's summed). Steps are those of either source, in step order; files last written
    before ``since`` are a previous run's and ignored. The trainer's folders hold metrics.jsonl
    only, so for it this is read_metrics with the rows merged.

    Raises:
        ConfigError: strict and a line of metrics.jsonl is not JSON.
    """
    rows = {r["step"]: r for r in _merged(read_metrics(run_dir, since=since, strict=strict))}
    per_rank = {rank: {r["step"]: r for r in _merged(_read(path, since))}
                for rank, path in _rank_files(run_dir, STEPS).items()}
    for step in sorted({s for recs in per_rank.values() for s in recs}):
        recs = [recs[step] for recs in per_rank.values() if step in recs]
        row = rows.setdefault(step, {"step": step})
        row.setdefault("step_time_s", max(r.get("step_time_s", 0.0) for r in recs))
        row.setdefault("rss_mb", [r.get("rss_mb") for r in recs])
        if any("device_peak_mb" in r for r in recs):
            row.setdefault("device_peak_mb", {rank: got[step].get("device_peak_mb")
                                              for rank, got in per_rank.items() if step in got})
    for step, total in traffic_totals(run_dir, since).items():
        if step in rows:
            rows[step].setdefault("traffic", total)
    return [rows[s] for s in sorted(rows)]


def rank_last_steps(run_dir: str, since: float = 0.0) -> dict[int, int]:
    """rank -> the last step of its own record (steps/rank-R.jsonl, the instruments of the user's code),
    for the ranks that have one written since ``since``."""
    out = {}
    for rank, path in _rank_files(run_dir, STEPS).items():
        steps = [r["step"] for r in _read(path, since) if isinstance(r.get("step"), int)]
        if steps:
            out[rank] = max(steps)
    return out


def last_step(run_dir: str | None, since: float = 0.0) -> int | None:
    """The step the run has reached: the larger of the ``step`` of the last complete row of
    RUN_DIR/metrics.jsonl and of rank 0's step records (steps/rank-0.jsonl, the instruments of the
    user's code: steps counted at optimizer steps, so a script need not log its own), of files
    written since ``since``; None when neither has one."""
    found = []
    for path in (os.path.join(run_dir or "", METRICS), os.path.join(run_dir or "", STEPS, "rank-0.jsonl")):
        if not run_dir or not os.path.isfile(path) or os.path.getmtime(path) < since:
            continue
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 4096))
            rows = _rows(fh.read(), path, strict=False)
        found += [r["step"] for r in rows if isinstance(r.get("step"), int)][-1:]
    return max(found) if found else None


class MetricsTail:
    """New complete rows of a metrics.jsonl as it grows (a rewritten, shorter file is read anew).
    A file last written before ``since`` (UNIX time; a previous run's, in a reused run folder)
    gives no rows until this run's job writes it."""

    def __init__(self, run_dir: str, since: float = 0.0, name: str = METRICS):
        self.path, self.offset, self.since = os.path.join(run_dir, name), 0, since

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


class StepsTail:
    """The run's progress as it grows: new rows of metrics.jsonl (``MetricsTail``) and of rank 0's
    step records (steps/rank-0.jsonl, the instruments of the user's code), each step given once,
    in order, as soon as either source has it (a row of both is merged)."""

    def __init__(self, run_dir: str, since: float = 0.0, total_steps: int | None = None):
        self.metrics = MetricsTail(run_dir, since)
        self.steps = MetricsTail(os.path.join(run_dir, STEPS), since, name="rank-0.jsonl")
        self.last, self.total = 0, total_steps

    def rows(self) -> list[dict]:
        """The steps completed since the last call, past the last one given."""
        new: dict = {}
        for r in self.steps.rows() + self.metrics.rows():
            if isinstance(r.get("step"), int) and r["step"] > self.last:
                new.setdefault(r["step"], {}).update(r)
        out = [new[s] for s in sorted(new)]
        for r in out:
            if isinstance(r.get("total_steps"), int):
                self.total = r["total_steps"]
            elif self.total:
                r["total_steps"] = self.total
        if out:
            self.last = out[-1]["step"]
        return out


