"""Step-by-step comparison of two metric series: alignment by step, relative difference, the first
divergence, the table text. Pure (stdlib only); ``launcher compare`` and ``train.parity`` share it.

    python -c "from simcluster.core.series import compare_series as c; \
print(c([(1, 0.5), (2, 0.3)], [(1, 0.5), (2, 0.31)], 1e-5).table())"

A series is a sequence of (step, value) pairs. ``compare_series(a, b, rtol)`` aligns them by step
(a step given twice keeps its first value), computes ``rel = |a - b| / |b|`` at each common step (b
is the reference; the absolute difference where b is 0; infinite where either is NaN or infinite
and they differ) and holds the steps only one side has. It is ok when both hold the same steps,
at least one, and every step's rel is at most rtol. Series come from a run folder's metrics.jsonl
rows (``series_from_rows``) or from log lines and a regular expression (``series_from_lines``).
"""
from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
from dataclasses import dataclass

Series = list[tuple[int, float]]
# The printed loss `up`, `report` and `sweep` read by default: "loss: 1.23", "loss=1.23", "Loss 1.23",
# "step 3 | loss 1.23", "step 3/10 loss 1.23", "Step [3/10], Loss: 1.23", torchtitan's "step:  3  loss:  8.1",
# "loss: tensor(1.23)", a dict's "'loss': 1.23" and "'lm loss': tensor(5.12)"; the step when "step N" comes
# before it (else the n-th match is step n). Not "val_loss", "loss_scale" or "train/loss" (a key of another
# name), and not a validation line's loss (TrainingLoss: "val loss 2.1", "eval loss: 2.1", torchtitan's
# "validate step: 10  loss: 7.8").
LOSS_REGEX = (r"(?i)(?:(?<![\w/])step\b[\s:=#\[(]*(?P<step>\d+)\b.*?)?(?<![\w./-])(?P<metric>(?:train[ _])?loss)\b"
              r"['\"]?[\s:=]*(?:tensor\(\[?)?(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|[-+]?nan|[-+]?inf)\b")
EVAL_WORD = re.compile(r"(?i)\b(?:val|valid|validation|validate|validating|eval|evaluate|evaluating|evaluation|"
                       r"test|testing|dev)\b")  # before a loss on its line: not the training loss


class TrainingLoss:
    """LOSS_REGEX as a pattern (``search``, ``groupindex``) that skips a validation line's loss: a
    match whose loss word comes after a validation word on its line (EVAL_WORD: val, validation,
    validate, eval, evaluation, test, dev...; ``val_loss``'s ``val`` is no word of its own);
    a later match on the line is tried next."""

    pattern = re.compile(LOSS_REGEX)
    groupindex = pattern.groupindex

    def search(self, text: str):
        for m in self.pattern.finditer(text):
            if not EVAL_WORD.search(text, 0, m.start("metric")):
                return m
        return None


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours (torchtitan's log lines carry them)


def rel(a: float, b: float) -> float:
    """|a - b| / |b|, the absolute difference when b is 0; 0 when a == b; inf when either is NaN
    or infinite and they differ."""
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / abs(b) if b else abs(a - b)


@dataclass(frozen=True)
class Row:
    """One common step: both values and their relative difference."""

    step: int
    a: float
    b: float
    rel: float


@dataclass(frozen=True)
class Comparison:
    """Two series compared step by step (see the module docstring).

    metric: the metric's name; labels: what A and B are (column headers, messages); rtol: the
    tolerance of rel; rows: the common steps in step order; only_a / only_b: (step, value) of the
    steps only A / only B has;
    max_rel: the largest rel (NaN without a common step); worst: its row; first_divergence: the
    first row with rel > rtol, else None; ok: same steps, at least one, none beyond rtol.
    """

    metric: str
    labels: tuple[str, str]
    rtol: float
    rows: tuple[Row, ...]
    only_a: tuple[tuple[int, float], ...]
    only_b: tuple[tuple[int, float], ...]
    max_rel: float
    worst: Row | None
    first_divergence: Row | None
    ok: bool

    def table(self) -> str:
        """The table text: step, A, B, rel_diff (see ``table_text``)."""
        return table_text([self])

    def problems(self) -> list[str]:
        """Why it is not ok, one line each: the first divergence (step and both values), the steps
        only one side has, no step at all; [] when ok."""
        a, b = self.labels
        lines = []
        if self.first_divergence is not None:
            r = self.first_divergence
            lines.append(f"{self.metric} diverges at step {r.step}: {a} {fmt(r.a)}, {b} {fmt(r.b)} "
                         f"(rel diff {r.rel:.1e} > rtol {self.rtol:g})")
        if self.only_a or self.only_b:
            lines.append(f"{self.metric}: {a} has {len(self.rows) + len(self.only_a)} steps, {b} has "
                         f"{len(self.rows) + len(self.only_b)}; " + "; ".join(
                             f"only {side} has step(s) {spans(s for s, _ in only)}"
                             for side, only in ((a, self.only_a), (b, self.only_b)) if only)
                         + (f"; compared the {len(self.rows)} common step(s)" if self.rows else "; no common step"))
        if not self.rows and not self.only_a and not self.only_b:
            lines.append(f"{self.metric}: no step to compare, both series are empty")
        return lines

    def verdict(self) -> list[str]:
        """problems(), then the largest difference and where (when a step was compared)."""
        lines = self.problems()
        if self.worst is not None:
            within = "within" if self.worst.rel <= self.rtol else "beyond"
            lines.append(f"max rel diff {self.max_rel:.3e} at step {self.worst.step} ({within} rtol {self.rtol:g}, "
                         f"{len(self.rows)} step(s) compared)")
        return lines


def compare_series(a: Series, b: Series, rtol: float, metric: str = "loss",
                   labels: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare two series step by step (b the reference); rtol is not checked (a negative one is
    never met). Raises nothing: different steps make a Comparison that is not ok."""
    first_a, first_b = _first(a), _first(b)
    rows = tuple(Row(s, first_a[s], first_b[s], rel(first_a[s], first_b[s])) for s in sorted(first_a)
                 if s in first_b)
    worst = max(rows, key=lambda r: (r.rel if not math.isnan(r.rel) else math.inf), default=None)
    first = next((r for r in rows if not r.rel <= rtol), None)
    only_a = tuple((s, first_a[s]) for s in sorted(set(first_a) - set(first_b)))
    only_b = tuple((s, first_b[s]) for s in sorted(set(first_b) - set(first_a)))
    return Comparison(metric, labels, rtol, rows, only_a, only_b, worst.rel if worst else math.nan, worst, first,
                      bool(rows) and first is None and not only_a and not only_b)


def _first(series: Series) -> dict[int, float]:
    out: dict[int, float] = {}
    for step, value in series:
        out.setdefault(int(step), float(value))
    return out


def fmt(value: float) -> str:
    """A value as the table shows it: 8 significant digits."""
    return f"{value:.8g}"


def table_text(comparisons: list[Comparison]) -> str:
    """One table of one or more comparisons over the union of their steps: ``step`` then, per
    comparison, its two labels and ``rel_diff``; ``-`` where a side lacks the step (rel_diff
    ``missing``). Right-aligned columns, one line per step, the header first."""
    steps = sorted({r.step for c in comparisons for r in c.rows}
                   | {s for c in comparisons for s, _ in c.only_a + c.only_b})
    header = ["step"] + [h for c in comparisons for h in (*c.labels, "rel_diff")]
    lines = [header]
    for step in steps:
        cells = [str(step)]
        for c in comparisons:
            row = next((r for r in c.rows if r.step == step), None)
            if row is not None:
                cells += [fmt(row.a), fmt(row.b), f"{row.rel:.1e}"]
            else:
                only_a, only_b = dict(c.only_a), dict(c.only_b)
                cells += [fmt(only_a[step]) if step in only_a else "-", fmt(only_b[step]) if step in only_b else "-",
                          "missing"]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)


def spans(steps) -> str:
    """``1-3, 7`` for [1, 2, 3, 7] (sorted ints)."""
    out: list[list[int]] = []
    for s in steps:
        if out and out[-1][1] == s - 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def series_from_rows(rows: list[dict], metric: str) -> Series:
    """(step, value) of each metrics.jsonl row with an integer ``step`` and the metric.

    Raises:
        ValueError: a row's metric is not a number (naming the step and the value).
    """
    out: Series = []
    for row in rows:
        step, value = row.get("step"), row.get(metric)
        if not isinstance(step, int) or isinstance(step, bool) or metric not in row:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{metric!r} at step {step} is {value!r}, not a number")
        out.append((step, float(value)))
    return out


TRY_BOUND_S = 2.0  # a --metric-regex tried once on PROBES ends within this, else it is refused
READ_BOUND_S = 30.0  # reading a run's lines with one ends within this (a sane pattern: well under a second)
# lines that make a backtracking pattern ((\d+)+x, (a|a)*b, (.*)*= ...) run for ever: long runs of what
# log lines hold, each ended by a character no such pattern expects
PROBES = tuple(unit * (3000 // len(unit)) + "!" for unit in ("1", "a", " ", "1.", "loss ", "step 1 loss 1.0 "))


@contextlib.contextmanager
def time_bound(seconds: float, what: str):
    """Run the block under a wall-clock bound (SIGALRM: re's matching loop checks signals).

    Raises:
        ValueError: the block still ran after ``seconds``, naming ``what``. In a thread other than
            the main one (no SIGALRM there) the block runs unbounded.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(*_):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except TimeoutError:
        raise ValueError(f"{what} still ran after {seconds:g} s: the pattern backtracks (nested or overlapping "
                         f"repeats such as (\\d+)+ or (.*)*); write each repeat once, e.g. 'loss ([0-9.eE+-]+)'") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def metric_pattern(text: str) -> re.Pattern:
    """A --metric-regex compiled and tried once on PROBES under TRY_BOUND_S: exactly one group (the
    value; the n-th match is step n), or named groups ``value`` and, optionally, ``step``, no other.

    Raises:
        ValueError: not a regular expression, not of those groups, or backtracking (the message says which).
    """
    try:
        pattern = re.compile(text)
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"{text!r} is not a regular expression: {e}; e.g. 'loss ([0-9.eE+-]+)'") from None
    names = set(pattern.groupindex)
    one = pattern.groups == 1 and "step" not in names
    named = "value" in names and names <= {"step", "value"} and pattern.groups == len(names)
    if not (one or named):
        raise ValueError(f"{text!r} has {pattern.groups} group(s){' named ' + ', '.join(sorted(names)) if names else ''}; "
                         f"give one group, the value (e.g. 'loss ([0-9.eE+-]+)'), or named groups step and value "
                         f"and no other (e.g. 'step (?P<step>\\d+)/\\d+ loss (?P<value>\\S+)'; (?:...) groups nothing)")
    with time_bound(TRY_BOUND_S, f"{text!r}, tried on a long line,"):
        for line in PROBES:
            pattern.search(line)
    if pattern.search(""):
        raise ValueError(f"{text!r} matches an empty line, so every line the ranks print would be a step with an empty "
                         f"value; anchor it on the text before the value, e.g. 'loss ([0-9.eE+-]+)'")
    return pattern


def series_from_lines(lines: list[str], pattern: re.Pattern) -> Series:
    """(step, value) of each line the pattern (metric_pattern's) is found in (re.search): the
    ``step`` group's number (where it took part), else the match's count (1, 2, ...); the ``value``
    group, else group 1. All lines are read within READ_BOUND_S.

    Raises:
        ValueError: a matched value or step is not a number (naming the line), or the reading
            outlasted its bound.
    """
    out: Series = []
    with time_bound(READ_BOUND_S, f"{pattern.pattern!r}, on the run's {len(lines)} lines,"):
        for line in lines:
            m = pattern.search(line)
            if not m:
                continue
            value = m.group("value") if "value" in pattern.groupindex else m.group(1)
            step = m.group("step") if "step" in pattern.groupindex and m.group("step") is not None else str(len(out) + 1)
            try:
                out.append((int(step), float(value)))
            except (TypeError, ValueError):
                raise ValueError(f"{pattern.pattern!r} matched {line.strip()[:200]!r}, but its step {step!r} or value "
                                 f"{value!r} is not a number; make the value group match a number only, e.g. "
                                 f"'loss ([0-9.eE+-]+)'") from None
    return out


def series_from_rank_lines(lines: list[tuple[int, str]], pattern: re.Pattern | None = None) -> tuple[int | None, Series]:
    """(rank, its series) of what the ranks printed ((rank, text) pairs in order, runlog.rank_lines):
    the lines of the highest rank that printed a match of ``pattern`` (default TrainingLoss), terminal
    colour codes taken off, read by ``series_from_lines``; (None, []) when no line matches. One rank's
    lines, so that a loss every rank prints is counted once a step; the highest, because under
    pipelining the loss lives on the last stage (pp outermost: its ranks are the highest) while the
    first stage's ranks print a placeholder (torchtitan's ``loss: -2.00000``).

    Raises:
        ValueError: a matched value or step is not a number (series_from_lines').
    """
    pattern = pattern or TrainingLoss()
    clean = [(rank, ANSI.sub("", text)) for rank, text in lines]
    rank = max((r for r, text in clean if pattern.search(text)), default=None)
    if rank is None:
        return None, []
    return rank, series_from_lines([text for r, text in clean if r == rank], pattern)
