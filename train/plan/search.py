"""Every mesh and schedule of a world size, ranked by predicted step time on a hardware model.

    python -m launcher plan --search --world-size 8 --model small [--hardware local] [--memory-per-rank GB]

A candidate is each pp x dp x tp = world size with each schedule (simcluster/core/config.py SCHEDULES), the
rest of the config as given; train/preflight.py decides which can run (its refusals are counted,
not ranked); each runnable one is planned (predict.py) and timed (steptime.py; on ``local`` with
each pp stage's overhead measured once a mesh, measure.stage_overhead, for all its schedules:
about 5 s a pp stage: 2.5 minutes for the 10 meshes of 8 ranks of the small model here, each
announced on stderr). Candidates whose
largest rank exceeds ``memory_per_rank`` are marked as not fitting; without it, the hardware's
memory a rank (hardware.memory_per_rank: a GPU's, or on ``local`` the machine's split over the ranks).
"""
from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from simcluster.core.config import SCHEDULES, Config
from simcluster.core.hardware import Hardware, memory_of_rank
from simcluster.train.plan.predict import plan
from simcluster.train.plan.steptime import StepTime, step_time
from simcluster.train.preflight import check, preflight


@dataclass(frozen=True)
class Candidate:
    """One runnable mesh and schedule: its slowest rank's StepTime, its largest rank's bytes, the
    bubble, whether it fits the memory a rank has."""

    mesh: str
    schedule: str
    microbatches: int
    step: StepTime
    peak_bytes: int
    bubble: float
    fits: bool


MAX_WORLD = 2**20  # --search's --world-size at most: meshes() walks every pp and dp (BENCHMARKS.md: 0.25 s at 10^6)


def meshes(world_size: int) -> list[str]:
    """Every PPxDPxTP whose product is world_size, pp outermost first."""
    return [f"{pp}x{dp}x{world_size // (pp * dp)}" for pp in range(1, world_size + 1) if world_size % pp == 0
            for dp in range(1, world_size // pp + 1) if (world_size // pp) % dp == 0]


def search(base: Config, world_size: int, hw: Hardware, memory_per_rank: float | None = None,
           progress: Callable[[str], None] | None = None) -> tuple[list[Candidate], dict[str, list[str]]]:
    """(the runnable candidates fastest first, each refused "MESH SCHEDULE" -> preflight's reasons);
    ``progress`` is told each mesh whose overhead is being measured (local only)."""
    found, refused = [], {}
    limit = memory_per_rank if memory_per_rank is not None else memory_of_rank(hw, world_size)
    every = meshes(world_size)
    for i, mesh in enumerate(every, 1):
        overhead = None  # local: measured on the mesh's first runnable schedule, used for all of its schedules
        for schedule in SCHEDULES:
            cfg = dataclasses.replace(base, mesh=mesh, schedule=schedule)
            problems = check(cfg, world_size)
            if problems:
                refused[f"{mesh} {schedule}"] = problems
                continue
            p = plan(preflight(cfg, world_size))
            if hw.shared_cores and overhead is None:
                from simcluster.train.plan.measure import overhead_for  # forks fake-group ranks

                if progress:
                    progress(f"search: measuring {mesh}'s overhead a pp stage on the fake process group "
                             f"(mesh {i}/{len(every)})")
                overhead = overhead_for(p, hw)
            slowest, _ = step_time(p, hw, overhead)
            peak = max(r.total for r in p.ranks)
            found.append(Candidate(mesh, schedule, p.run.config.microbatches, slowest, peak, p.bubble,
                                   peak <= limit))
    return sorted(found, key=lambda c: (not c.fits, c.step.total)), refused


def none_runs(refused: dict[str, list[str]], world_size: int) -> str:
    """Why no mesh x schedule of ``world_size`` ranks runs: preflight's commonest reasons (numbers folded,
    each with its count), one refused candidate's own words, and the fix."""
    common = collections.Counter(re.sub(r"\d+", "N", r.split(";")[0]) for rs in refused.values() for r in rs)
    first = next(iter(refused.items()), None)
    example = f"; e.g. {first[0]}: {first[1][0]}" if first else ""
    return (f"search: none of the {len(refused)} meshes x schedules of {world_size} ranks passes preflight (most "
            f"often: {'; '.join(f'{r} ({n}x)' for r, n in common.most_common(2))}){example}; pick a --world-size "
            f"the model and --global-batch can be spread over, e.g. --world-size 8, or raise --global-batch "
            f"and the model's sizes")


def to_text(found: list[Candidate], refused: dict[str, list[str]], hw: Hardware, world_size: int,
            memory_per_rank: float | None = None) -> str:
    """The ranked table; its header says which memory a rank "fits" was checked against."""
    limit = memory_per_rank if memory_per_rank is not None else memory_of_rank(hw, world_size)
    lines = [f"search: {len(found)} runnable meshes x schedules of {world_size} ranks on {hw.name}, fastest first "
             f"({len(refused)} refused by preflight); fits: the largest rank's tensors within "
             f"{limit / 1e9:.1f} GB a rank" + ("" if memory_per_rank is not None else " (--memory-per-rank to set it)"),
             f"{'':>3} {'mesh':>7} {'schedule':>16} {'mb':>3} {'step ms':>9} {'compute':>8} {'comm':>8} "
             f"{'bubble':>8} {'optim':>8} {'peak MB':>8} fits"]
    for i, c in enumerate(found, 1):
        s = c.step
        lines.append(f"{i:>3} {c.mesh:>7} {c.schedule:>16} {c.microbatches:>3} {1e3 * s.total:>9.2f} "
                     f"{1e3 * s.compute:>8.2f} {1e3 * s.communication:>8.2f} {1e3 * s.bubble:>8.2f} "
                     f"{1e3 * s.optimizer:>8.2f} {c.peak_bytes / 1e6:>8.1f} {'yes' if c.fits else 'NO'}")
    return "\n".join(lines)
