"""The logging API of the user's code: ``simcluster.log`` and ``simcluster.step`` (stdlib only).

    python -c "import simcluster; simcluster.log(step=1, loss=2.5)"     # outside the cluster: a no-op

``simcluster.log(step=None, *, total_steps=None, **metrics)`` appends one row to
$SIMCLUSTER_OUTPUT_DIR/metrics.jsonl, the schema of simcluster/core/metrics.py (``{"step", "loss", ...}``),
which progress, the summary, the report and ``launcher compare`` read. Call it on the rank that
holds the values (rank 0, or the last pipeline stage for a loss); rows of one step logged by
several ranks are merged by the readers, a later row's keys winning. ``step`` defaults to the
step the instruments last counted (instrument/clock.py), else 1 + the last step logged here.
``total_steps`` gives progress its ETA. ``simcluster.step()`` marks the end of a step for code
whose steps are not optimizer steps. Outside a rank of the cluster (no SIMCLUSTER_OUTPUT_DIR)
both do nothing, so the script runs unchanged under plain torchrun.
"""
from __future__ import annotations

import json
import math
import os

_last_step = 0


def log(step: int | None = None, *, total_steps: int | None = None, **metrics) -> None:
    """Append ``{"step": step, **metrics}`` (and ``total_steps``) to RUN_DIR/metrics.jsonl.

    metrics: JSON values (floats, ints, strings, lists); a 0-d tensor or numpy scalar is turned
    into a float with ``float()``.

    Raises:
        TypeError: step or total_steps not a positive int, or a metric that is not a JSON value.
    """
    global _last_step
    out_dir = os.environ.get("SIMCLUSTER_OUTPUT_DIR")
    if not out_dir:
        return
    if step is None:
        from simcluster.launcher.instrument import rank
        step = rank.CLOCK.step if rank.CLOCK is not None and rank.CLOCK.step else _last_step + 1
    for name, value in (("step", step), ("total_steps", total_steps)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise TypeError(f"simcluster.log: {name} must be a positive int, got {value!r}; e.g. "
                            f"simcluster.log(step=3, loss=0.5, total_steps=10)")
    row = {"step": step}
    if total_steps is not None:
        row["total_steps"] = total_steps
    for name, value in metrics.items():
        if hasattr(value, "item") and not isinstance(value, (list, str)):
            value = float(value)
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # JSON has no nan/inf; keep it visible
        try:
            json.dumps(value)
        except TypeError:
            raise TypeError(f"simcluster.log: metric {name}={value!r} is not a JSON value; pass a number, "
                            f"a string or a list, e.g. loss=float(loss)") from None
        row[name] = value
    _last_step = step
    os.makedirs(out_dir, exist_ok=True)
    from simcluster.core.rundir import METRICS

    with open(os.path.join(out_dir, METRICS), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")  # one write of one line: appends from several ranks stay whole


def step() -> None:
    """Mark the end of a step (for code whose steps are not optimizer steps); a no-op outside a rank."""
    from simcluster.launcher.instrument import rank

    if rank.CLOCK is not None:
        rank.CLOCK.mark()
