"""Reading a compare's two runs: the options of the comparison checked, the metric's series of
each side, why a side failed, and the table and verdict `launcher compare` prints.

    python -c "from simcluster.launcher.compare_read import check_options; check_options('loss', None, 1e-5)"

Split from launcher/compare.py (which runs the two sides) by concern; compare.py re-exports
result_text for the CLI.
"""
from __future__ import annotations


from simcluster.launcher.job.files import repo_path
from simcluster.core.errors import ConfigError
from simcluster.core.rundir import METRICS, NOT_SERIES, NUMBERS, step_rows
from simcluster.core.runlog import printed_series, rank_lines, summary_lines
from simcluster.core.series import Comparison, Series, series_from_rows
from simcluster.core.series_read import metric_pattern, series_from_lines


MAX_RTOL = 1.0  # |A - B| / |B| above 1 lets A = 0 or -B pass


DEFAULT_METRIC = "loss"  # --metric unset and no --metric-regex: the key compared (the name the table gives it)


def check_options(metric: str | None, metric_regex: str | None, rtol: float) -> str:
    """--metric, --metric-regex and --rtol, before anything starts; the metric's name (DEFAULT_METRIC when
    --metric is unset). --metric reads metrics.jsonl's rows and --metric-regex printed lines: one of them.

    Raises:
        ConfigError: naming the flag, the value and a fix.
    """
    if metric is not None and (isinstance(metric, bool) or not isinstance(metric, str)):
        raise ConfigError(f"--metric: a key of your metrics.jsonl rows (text), got {metric!r}; e.g. metric='loss'")
    if metric_regex is not None and not isinstance(metric_regex, str):
        raise ConfigError(f"--metric-regex: a regular expression (text), got {metric_regex!r}; e.g. "
                          f"metric_regex=r'loss (\\S+)'")
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not (0 <= rtol <= MAX_RTOL):
        raise ConfigError(f"--rtol: must be a finite number in [0, {MAX_RTOL:g}] (the largest relative difference "
                          f"allowed; beyond 1 a value of another sign passes: nothing is compared), got {rtol}; e.g. "
                          f"--rtol 1e-5 (0: bit-identical)")
    if metric is not None and (not metric or not metric.strip()):
        raise ConfigError(f"--metric: empty ({metric!r}); name a key of your metrics.jsonl rows, e.g. --metric loss")
    if metric is not None and metric_regex is not None:
        raise ConfigError(f"--metric {metric}: no effect with --metric-regex '{metric_regex}' (--metric reads a key of "
                          f"metrics.jsonl's rows, --metric-regex the lines the ranks print); give one, e.g. --metric "
                          f"{metric} or --metric-regex '{metric_regex}'")
    if metric in NOT_SERIES:
        raise ConfigError(f"--metric {metric}: not a number a step logs ({', '.join(NOT_SERIES)} are the step axis and "
                          f"per-rank objects); name a number of your metrics.jsonl rows, e.g. --metric loss")
    if metric_regex is not None:
        try:
            metric_pattern(metric_regex)
        except ValueError as e:
            raise ConfigError(f"--metric-regex: {e}") from None
    return metric or DEFAULT_METRIC


def check_trainer_metric(metric: str, config) -> None:
    """A --metric the built-in trainer logs (rundir.NUMBERS; val_loss only where it validates), before its
    first run; config: its resolved Config.

    Raises:
        ConfigError: naming the value and the keys it logs.
    """
    keys = [k for k in NUMBERS if k != "val_loss" or config.val_every]
    if metric not in keys:
        raise ConfigError(f"--metric {metric}: the built-in trainer logs no such number in its metrics.jsonl "
                          f"(val_loss only with --val-every above 0); name one of {', '.join(keys)}, e.g. --metric "
                          f"{keys[0]}")


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
    lines its ranks printed (cluster.log) that metric_regex matches. Without metric_regex, a
    "loss" that no row holds is read from what the ranks printed in the common formats, as `up`'s
    summary reads it (runlog.printed_series: the highest rank that prints one).

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
    if not series and metric == "loss":  # a loss the ranks only printed, read as `up`'s summary reads it
        _, series = printed_series(side.run_dir)
        if series:
            return series
    path = f"{repo_path(side.run_dir)}/{METRICS}"
    if not rows:
        raise ConfigError(f"--metric {metric}: {where} wrote no {path}; append {{\"step\": N, \"{metric}\": X}} per "
                          f"step to $SIMCLUSTER_OUTPUT_DIR/{METRICS}, or read printed lines with --metric-regex REGEX")
    if not series:
        keys = sorted({k for r in rows for k in r})
        raise ConfigError(f"--metric {metric}: {where}'s steps ({path} and the instruments' steps/) have no "
                          f"{metric!r} in their {len(rows)} rows; their keys: "
                          f"{', '.join(keys)}; pass one with --metric (e.g. --metric {next(iter(keys), 'loss')}), "
                          f"or read what the ranks print with --metric-regex REGEX (e.g. --metric-regex 'loss (\\S+)')")
    return series


def result_text(c: Comparison) -> str:
    """What `launcher compare` prints at the end: the table, how it ended, and the verdict line."""
    head = f"compare {c.metric} step by step: rel_diff = |A - B| / |B|, rtol {c.rtol:g}"
    verdict = (f"compare: OK: {c.metric} of {c.labels[0]} and {c.labels[1]} agree within rtol {c.rtol:g} at all "
               f"{len(c.rows)} steps" if c.ok else f"compare: FAILED: {c.metric} differs beyond rtol {c.rtol:g} or "
               f"in its steps (above)")
    return "\n".join([head, c.table(), *c.verdict(), verdict])
