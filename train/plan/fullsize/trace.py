"""A full-size rank's trace on disk: the recorder's events, phases, placeholders, JSON.

    python -c "from simcluster.train.plan.fullsize.trace import read; print(read.__doc__)"

Format (one JSON object): ``rank``, ``world_size``, ``seconds`` (the run's wall time here),
``steps`` (optimizer steps seen), ``phases`` (names), ``events`` (lists, see record.Recorder),
``placeholders`` (program line -> how many ``.item()``, ``allclose`` or ``equal`` got a placeholder),
``error`` (the program's failure under the fake mode, or null), ``custom`` (ops outside torch's
namespaces the program ran).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

# a frame whose file path holds one of these is torch's or the full-size plan's, not the program's: the
# line a placeholder or a failure names is the innermost other one
NOT_THE_PROGRAM = ("/torch/", "instrument/fullsize.py", "instrument/fullsize_real.py", "/plan/fullsize/")


@dataclass(frozen=True)
class Trace:
    """One rank's recorded run (see the module's docstring for the fields)."""

    rank: int
    world_size: int
    seconds: float
    steps: int
    phases: tuple[str, ...]
    events: tuple[tuple, ...]
    placeholders: dict
    error: str | None
    custom: tuple[str, ...] = ()


def write(path: str, rec, rank: int, world_size: int, seconds: float, error: str | None) -> None:
    """Write the Recorder ``rec``'s trace to ``path``."""
    data = {"rank": rank, "world_size": world_size, "seconds": round(seconds, 2), "steps": rec.steps,
            "phases": rec.phases, "events": rec.events, "placeholders": rec.placeholders, "error": error,
            "custom": sorted(rec.custom)}
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))


def read(path: str) -> Trace:
    """The Trace written at ``path``."""
    with open(path) as f:
        d = json.load(f)
    return Trace(d["rank"], d["world_size"], d["seconds"], d["steps"], tuple(d["phases"]),
                 tuple(tuple(e) for e in d["events"]), d["placeholders"], d["error"], tuple(d.get("custom", ())))
