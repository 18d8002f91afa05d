"""The run folder's records that `launcher up` and the trainer write beside the ranks' own: cluster.log
(every line shown, the summary last), summary.json, job.json (the job's nodes, ranks and image, at its
start), config.yaml (the trainer's resolved config), data.json (its corpus's identity) and trace.json; read here alone, each named by
file and line when it cannot be read.

    python -c "from simcluster.core.runlog import summary_lines, read_job; print(summary_lines('runs/mesh-2x1x1')[:2], read_job('runs/mesh-2x1x1'))"

The ranks' records (metrics.jsonl, steps/, traffic/) are rundir.py's.
"""
from __future__ import annotations

import glob
import json
import os
import re

from simcluster.core.errors import ConfigError
from simcluster.core.paths import unresolved
from simcluster.core.rundir import METRICS, STEPS, _is_number, read_json_since

TRACE = "trace.json"
CONFIG = "config.yaml"  # the built-in trainer's resolved config
CLUSTER_LOG = "cluster.log"  # every line `launcher up` showed, its summary last
SUMMARY = "summary.json"  # the summary as data (observe/summary.py _record), written once the run has ended
_RANK_LINE = re.compile(r"^node-\d+ r(\d+)\s*\| (.*)$")  # observe/follow.py Stream.handle's prefix
DATA = "data.json"  # the built-in trainer's corpus identity (corpus.data_identity), written by rank 0 at start
JOB = "job.json"  # the job as `up` started it: nodes -> ranks, nproc_per_node, world_size, image (write_job)


def run_folder(run_dir: str, field: str, example: str) -> str:
    """RUN_DIR itself once it is a folder.

    Raises:
        ConfigError: missing (a dead or looping link too), or a file rather than a folder: ``field`` names the
            input (e.g. ``report: --run-dir``), ``example`` a command line that would work.
    """
    if what := unresolved(run_dir, "nothing there", target=False):
        raise ConfigError(f"{field} {run_dir!r} is not a folder ({what}); pass a run folder of `launcher up`, e.g. "
                          f"{example}")
    if not os.path.isdir(run_dir):
        raise ConfigError(f"{field} {run_dir!r} is not a folder (a file); pass the run folder of `launcher up` "
                          f"(it holds metrics.jsonl, config.yaml, ...), e.g. {example}")
    return run_dir


def read_config(run_dir: str) -> dict | None:
    """RUN_DIR/config.yaml (the built-in trainer's resolved config) as a mapping; None without one.

    Raises:
        ConfigError: it cannot be read, is not YAML (cut short, garbage) or not a mapping, naming
            the file, the line where the YAML parser stopped, and the fix.
    """
    path = os.path.join(run_dir, CONFIG)
    if not os.path.exists(path):
        return None
    import yaml  # the trainer's ranks, which import this module, never read a config back

    try:
        with open(path, encoding="utf-8") as fh:
            values = yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror}); it should be the YAML config the trainer "
                          f"wrote, e.g. 'mesh: 2x2x2'") from None
    except (yaml.YAMLError, ValueError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not YAML ({getattr(e, 'problem', None) or e}); the trainer writes it "
                          f"whole (e.g. 'mesh: 2x2x2'): rerun the job, or restore the file") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: holds {type(values).__name__}, not a mapping of config fields (e.g. "
                          f"'mesh: 2x2x2'); rerun the job, or restore the file")
    return values


def read_trace(run_dir: str) -> list[dict] | None:
    """RUN_DIR/trace.json's events (the merged Chrome trace of --trace-steps); None without one.

    Raises:
        ConfigError: it is not JSON or holds no ``traceEvents`` list of objects, naming the file.
    """
    path = os.path.join(run_dir, TRACE)
    if not os.path.exists(path):
        return None
    fix = "rerun with --trace-steps S, or delete the file"
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror}); {fix}") from None
    except ValueError as e:
        where = f" line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ConfigError(f"{path}{where}: not JSON ({getattr(e, 'msg', e)}; cut short?); {fix}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ConfigError(f"{path}: no \"traceEvents\" list of objects (a Chrome trace, "
                          f"e.g. {{\"traceEvents\": [...]}}); {fix}")
    for n, e in enumerate(events):
        if e.get("ph") != "X":
            continue
        bad = next((k for k in ("ts", "dur", "tid") if not _is_number(e.get(k))), None) \
            or ("name" if not isinstance(e.get("name"), str) else None) \
            or ("args" if not isinstance(e.get("args", {}), dict) else None)
        if bad:
            raise ConfigError(f"{path}: event {n} has {bad} {e.get(bad)!r} (a complete event needs a string name, "
                              f"numbers ts, dur and tid, an args object); {fix}")
    return events


def _write_json(path: str, record: dict) -> None:
    """Write a record to path whole or not at all (a temporary file, then a rename)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    os.replace(tmp, path)


def write_summary(run_dir: str, record: dict) -> None:
    """Write RUN_DIR/summary.json (the ended run's summary as data) whole or not at all."""
    _write_json(os.path.join(run_dir, SUMMARY), record)


def write_data(run_dir: str, identity: dict) -> None:
    """Write RUN_DIR/data.json: the corpus a run of the built-in trainer trains on (corpus.data_identity)."""
    _write_json(os.path.join(run_dir, DATA), identity)


def read_data(run_dir: str, since: float = 0.0) -> dict | None:
    """RUN_DIR/data.json when this run wrote it (modified at or after ``since``, UNIX time), else None."""
    record = read_json_since(os.path.join(run_dir, DATA), since)
    return record if isinstance(record, dict) else None


def read_summary(run_dir: str) -> dict | None:
    """RUN_DIR/summary.json of the folder's last ended run, or None (none ended yet, or unreadable)."""
    try:
        with open(os.path.join(run_dir, SUMMARY), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def last_summary(run_dir: str | None) -> tuple[float, str | None] | None:
    """(UNIX time RUN_DIR/cluster.log was last written, its last ``== summary: OK|FAILED|HANG|NO WORK ==``
    line or None), or None without a cluster.log: when and how the folder's last `up` ended."""
    path = os.path.join(run_dir or "", CLUSTER_LOG)
    if not run_dir or not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 65536))
        lines = fh.read().decode("utf-8", "replace").splitlines()
    return os.path.getmtime(path), next((ln.strip() for ln in reversed(lines) if ln.startswith("== summary:")), None)


def newest_run(root: str) -> str:
    """The folder under ROOT/runs whose metrics.jsonl (or, for the user's code, steps/rank-0.jsonl) changed last.

    Raises:
        ConfigError: none has one, naming the fix.
    """
    found = glob.glob(os.path.join(root, "runs", "**", METRICS), recursive=True) \
        + glob.glob(os.path.join(root, "runs", "**", STEPS, "rank-0.jsonl"), recursive=True)
    if not found:
        raise ConfigError(f"report: no run with a metrics.jsonl under {os.path.join(root, 'runs')}; "
                          f"run one first (python -m launcher up ...) or pass --run-dir DIR")
    newest = max(found, key=os.path.getmtime)
    return os.path.dirname(newest) if newest.endswith(METRICS) else os.path.dirname(os.path.dirname(newest))


def _log_lines(run_dir: str) -> list[str]:
    """RUN_DIR/cluster.log's lines; [] without one."""
    try:
        with open(os.path.join(run_dir, CLUSTER_LOG), encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def rank_lines(run_dir: str) -> list[tuple[int, str]]:
    """(rank, text) of each line a rank printed, from RUN_DIR/cluster.log in order: the text as the
    rank printed it (the ``node-K rR |`` prefix taken off); [] without a cluster.log."""
    return [(int(m.group(1)), m.group(2)) for line in _log_lines(run_dir) if (m := _RANK_LINE.match(line))]


def printed_series(run_dir: str, regex: str | None = None) -> tuple[int | None, list[tuple[int, float]]]:
    """(rank, its (step, value) pairs) of a metric the ranks printed (cluster.log): the highest rank
    (the last pipeline stage's, where the loss lives) whose lines match ``regex`` (a --metric-regex: one group, or groups step and value), by default
    series_read.LOSS_REGEX (the common ways of printing a loss); (None, []) when none matches, or when a
    match of the default is no number (simcluster/core/series_read.py series_from_rank_lines, the one home of these rules).

    Raises:
        ValueError: regex is not a --metric-regex (series_read.metric_pattern's message), a match of it is
            no number, or reading outlasted series_read.READ_BOUND_S.
    """
    from simcluster.core.series_read import metric_pattern, series_from_rank_lines

    pattern = metric_pattern(regex) if regex is not None else None
    try:
        return series_from_rank_lines(rank_lines(run_dir), pattern)
    except ValueError:
        if regex is not None:  # the user's pattern met a non-number: said, never a loss silently dropped
            raise
        return None, []


def log_lines(run_dir: str, node: str | None = None, rank: int | None = None) -> list[str]:
    """RUN_DIR/cluster.log's lines as `up` showed them (``node-1 r4 | text``), or only those of
    one node (its agent's and its ranks' lines), or only what one rank printed (the text, its
    prefix taken off; rank wins over node); [] without a cluster.log."""
    if rank is not None:
        return [text for r, text in rank_lines(run_dir) if r == rank]
    lines = _log_lines(run_dir)
    if node is None:
        return lines
    own = re.compile(rf"^{re.escape(node)}(?: r\d+)?\s*\| ")
    return [line for line in lines if own.match(line)]


def summary_lines(run_dir: str) -> list[str]:
    """The lines of RUN_DIR/cluster.log's last summary, from its ``== summary: OK|FAILED|HANG|NO WORK ==`` line
    on; [] without one."""
    lines = _log_lines(run_dir)
    start = max((i for i, line in enumerate(lines) if line.startswith("== summary:")), default=None)
    return [] if start is None else lines[start:]


def write_job(run_dir: str, record: dict) -> None:
    """Write RUN_DIR/job.json (the job as `up` starts it) whole or not at all."""
    _write_json(os.path.join(run_dir, JOB), record)


def read_job(run_dir: str | None) -> dict | None:
    """RUN_DIR/job.json: {"nodes": {name: "first-last"}, "nproc_per_node", "world_size", "image", the
    last step "steps" where known, and on rehearsal hosts "hosts": {name: host} (every node, in node order)}, or None
    when the folder has none (a run of an older launcher, or a compose file started by hand).

    Raises:
        ConfigError: the file exists but is not such a record (naming it and the fix).
    """
    path = os.path.join(run_dir, JOB) if run_dir else None
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a job record ({e}); delete it, or rerun the job with launcher up") from None
    nodes = record.get("nodes") if isinstance(record, dict) else None
    if not (isinstance(nodes, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in nodes.items())
            and isinstance(record.get("world_size"), int)):
        raise ConfigError(f"{path}: not a job record (nodes and world_size); delete it, or rerun the job with "
                          f"launcher up")
    hosts = record.get("hosts")
    if hosts is not None and not (isinstance(hosts, dict) and list(hosts) == list(nodes)
                                  and all(isinstance(v, str) and v for v in hosts.values())):
        shown = sorted(hosts) if isinstance(hosts, dict) else type(hosts).__name__
        raise ConfigError(f"{path}: its \"hosts\" map ({shown}) does not name a host for each of its nodes "
                          f"({', '.join(nodes)}), in node order; the record is truncated or edited: rerun the job "
                          f"with launcher up --target swarm --hosts N")
    steps = record.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"{path}: its \"steps\" ({steps!r}) is not a step count >= 1; delete it, or rerun the job "
                          f"with launcher up")
    return record
