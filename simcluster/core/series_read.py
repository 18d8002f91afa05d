"""A metric series read from the lines the ranks printed: a --metric-regex compiled and tried once under a
time bound (``metric_pattern``), the lines read with it (``series_from_lines``), or, without one, the common
ways of printing a loss (LOSS_REGEX, a validation line's loss skipped: ``TrainingLoss``) on the highest rank
that prints one (``series_from_rank_lines``). Pure (stdlib only); the comparison of two series is
simcluster/core/series.py.

    python -c "from simcluster.core.series_read import series_from_rank_lines as s; print(s([(0, 'step 1 loss 2.5'), (0, 'step 2 loss 2.25')]))"
"""
from __future__ import annotations

import contextlib
import re
import signal
import threading

from simcluster.core.series import Series

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
