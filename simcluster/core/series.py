"""Step-by-step comparison of two metric series: alignment by step, relative difference, the first
divergence, the table text. Pure (stdlib only); ``launcher compare`` and ``train.parity`` share it.

    python -c "from simcluster.core.series import compare_series as c; \
print(c([(1, 0.5), (2, 0.3)], [(1, 0.5), (2, 0.31)], 1e-5).table())"

A series is a sequence of (step, value) pairs. ``compare_series(a, b, rtol)`` aligns them by step
(a step given twice keeps its first value), computes ``rel = |a - b| / |b|`` at each common step (b
is the reference; the absolute difference where b is 0; infinite where either is NaN or infinite
and they differ) and holds the steps only one side has. It is ok when both hold the same steps,
at least one, and every step's rel is at most rtol. Series come from a run folder's metrics.jsonl
rows (``series_from_rows``) or from the lines the ranks printed (simcluster/core/series_read.py:
``series_from_lines``, the --metric-regex rules and the common ways of printing a loss).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Series = list[tuple[int, float]]
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
