"""A finished run's metric series and why it failed: what ``launcher compare`` reads of each side.

    python -c "from simcluster.launcher.observe.metric import failure_text; from types import SimpleNamespace as S; \
print(failure_text(S(run_dir='runs/none')))"

``side``: anything with ``run_dir`` (the host run folder) and ``label`` (``A (mesh 2x2x2)``):
compare.py's Side.
"""
from __future__ import annotations

from simcluster.launcher.job.files import repo_path
from simcluster.train.errors import ConfigError
from simcluster.train.rundir import METRICS, rank_lines, step_rows, summary_lines
from simcluster.train.series import Series, metric_pattern, series_from_lines, series_from_rows


def failure_text(side) -> str:
    """Why a side's run failed, from its summary: the failed and lost ranks' lines, else the nodes'
    non-zero exits."""
    lines = [ln.strip() for ln in summary_lines(side.run_dir)]
    picked = [ln for ln in lines if ln.startswith(("FAILED rank", "LOST", "then failed", "no rank printed",
                                                     "killed by up"))]
    picked = picked or [ln for ln in lines if ln.startswith("node-") and " exit 0" not in ln]
    return "; ".join(picked) if picked else "no summary in its cluster.log"


def read_series(side, metric: str, metric_regex: str | None) -> Series:
    """The metric's series of a finished side: ``metric`` of its step rows (rundir.step_rows:
    metrics.jsonl, rows of one step merged, joined with the instruments' step records), or the
    lines its ranks printed (cluster.log) that metric_regex matches.

    Raises:
        ConfigError: the series is empty or not numbers (naming the run, what it logged and a fix).
    """
    where = f"run {side.label}"
    try:
        if metric_regex is not None:
            lines = [text for _, text in rank_lines(side.run_dir)]
            series = series_from_lines(lines, metric_pattern(metric_regex))
            if not series:
                sample = "; ".join(repr(t) for t in lines[-3:]) or "none"
                raise ConfigError(f"--metric-regex: no line of {where}'s ranks matches {metric_regex!r} "
                                  f"({len(lines)} rank lines in {repo_path(side.run_dir)}/cluster.log; its last: "
                                  f"{sample}); fix the regex")
            return series
        rows = step_rows(side.run_dir)
        series = series_from_rows(rows, metric)
    except ValueError as e:
        raise ConfigError(f"--metric{'-regex' if metric_regex else ''}: {where}: {e}") from None
    path = f"{repo_path(side.run_dir)}/{METRICS}"
    if not rows:
        raise ConfigError(f"--metric {metric}: {where} wrote no {path}; append {{\"step\": N, \"{metric}\": X}} per "
                          f"step to $SIMCLUSTER_OUTPUT_DIR/{METRICS}, or read printed lines with --metric-regex REGEX")
    if not series:
        keys = sorted({k for r in rows for k in r})
        raise ConfigError(f"--metric {metric}: {where}'s steps ({path} and the instruments' steps/) have no "
                          f"{metric!r} in their {len(rows)} rows; their keys: "
                          f"{', '.join(keys)}; pass one with --metric, e.g. --metric {next(iter(keys), 'loss')}")
    return series
