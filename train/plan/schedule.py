"""A schedule's order of work, from torch itself: microbatches in flight per stage and the bubble.

    python -c "from simcluster.train.plan.schedule import rank_orders; print(rank_orders('1f1b', 2, 4, 1))"

The order is torch's own action list, ``torch.distributed.pipelining._schedule_visualizer
.get_schedule_ops`` (each schedule class's ``pipeline_order``), one list per pp rank of actions
``F``, ``B`` (full backward), ``I``/``W`` (input / weight half of a split backward) and
``OVERLAP_F_B`` (DualPipeV: a forward and a backward as one action), per stage and microbatch.
One repair: torch 2.13's ``Schedule1F1B._get_pipeline_order`` numbers the last rank's microbatches
from 1 (``1F1 .. 1F4`` for 4 microbatches); the schedule runs them 0..m-1 in that same F/B pattern
(``_step_microbatches``), so for the one-stage schedules (gpipe, 1f1b) each rank's forwards and
backwards are renumbered in order.

The bubble is the order run on a clock: each action starts when its rank is free and its inputs
are done (F after the previous stage's F of that microbatch; B and I after the next stage's B/I
and this stage's F; W after this stage's I), taking its stage's FLOPs (``shapes.stage_cost``: F
the forward, B the backward, I and W half of it each), communication free. The fraction is the
measured bubble's definition (simcluster/core/timeline.py ``bubble``): mean over ranks of the share of the
step's window (first start to last end of any rank) the rank computes nothing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch.distributed.pipelining.schedules as schedules
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

from simcluster.core.config import SCHEDULES

Act = tuple[str, int, int]  # (kind "F" | "B" | "I" | "W", stage, microbatch)


@functools.lru_cache(maxsize=64)
def rank_orders(schedule: str, pp: int, microbatches: int, local_stages: int) -> tuple[tuple[Act, ...], ...]:
    """Each pp rank's compute actions in torch's order, OVERLAP_F_B split into its F then its B."""
    cls_name, layout = SCHEDULES[schedule]
    cls = getattr(schedules, cls_name)
    ops = get_schedule_ops(cls, pp, microbatches, None if layout == "single" else local_stages)
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    out = []
    for rank_ops in ops:
        acts: list[Act] = []
        for a in rank_ops:
            for sub in (a.sub_actions or ()) if a is not None and getattr(a, "sub_actions", None) else [a]:
                kind = kinds.get(sub.computation_type.name) if sub is not None else None
                if kind:
                    acts.append((kind, sub.stage_index, sub.microbatch_index))
        out.append(tuple(_renumbered(acts) if layout == "single" else acts))
    return tuple(out)


def _renumbered(acts: list[Act]) -> list[Act]:
    """Each kind's microbatches numbered 0, 1, ... in order (the repair above, torch 2.13 Schedule1F1B)."""
    count: dict[str, int] = {}
    out = []
    for kind, stage, _ in acts:
        out.append((kind, stage, count.get(kind, 0)))
        count[kind] = count.get(kind, 0) + 1
    return out


def in_flight(order: tuple[Act, ...]) -> tuple[dict[int, int], list[dict[int, int]]]:
    """(the most microbatches each stage holds activations of at once, the holdings after every
    forward): a microbatch is held from its F to its B, or to its W where the backward is split
    (the weight half still reads the saved inputs)."""
    now: dict[int, int] = {}
    most: dict[int, int] = {}
    after_f = []
    for kind, stage, _ in order:
        if kind == "F":
            now[stage] = now.get(stage, 0) + 1
            most[stage] = max(most.get(stage, 0), now[stage])
            after_f.append(dict(now))
        elif kind in ("B", "W"):
            now[stage] -= 1
    return most, after_f


@dataclass(frozen=True)
class Timeline:
    """The order on a clock (units of ``durations``): per rank its busy time; window: first start
    to last end over all ranks; bubble: mean over ranks of 1 - busy / window."""

    busy: tuple[float, ...]
    window: float

    @property
    def bubble(self) -> float:
        return sum(1 - b / self.window for b in self.busy) / len(self.busy) if self.window else 0.0


def simulate(orders: tuple[tuple[Act, ...], ...], durations: dict[tuple[str, int], float],
             transfers: dict[tuple[str, int], float] | None = None) -> Timeline:
    """Run each rank's actions in order as soon as their inputs are there; durations: (kind, stage) -> time.

    transfers: (kind, stage) -> time of the send an F (its activations, to stage + 1) or a B/I (its
    input grads, to stage - 1) makes when that stage lives on another pp rank; a rank's sends
    leave one after another on its one link (a node's egress), each starting when its action
    ends and the link is free, without holding the rank (torch's isend). None: sends are free.

    Raises:
        RuntimeError: the order deadlocks (an action waits on one that never runs).
    """
    n_stages = 1 + max(s for order in orders for _, s, _ in order)
    rank_of = {s: r for r, order in enumerate(orders) for _, s, _ in order}
    done: dict[Act, float] = {}
    arrives: dict[Act, float] = {}  # when an action's output is at the rank that consumes it
    pos, free, link = [0] * len(orders), [0.0] * len(orders), [0.0] * len(orders)
    busy, first = [0.0] * len(orders), None
    while any(p < len(o) for p, o in zip(pos, orders)):
        progressed = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                act = order[pos[r]]
                local, remote = _deps(act, n_stages, done)
                if any(d is None or d not in done for d in local + remote):
                    break
                kind, s, _ = act
                start = max([free[r]] + [done[d] for d in local] + [arrives[d] for d in remote])
                first = start if first is None else min(first, start)
                free[r] = start + durations[(kind, s)]
                busy[r] += durations[(kind, s)]
                done[act] = free[r]
                arrives[act] = _sent(act, free[r], r, rank_of, n_stages, transfers, link)
                pos[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule order deadlocks at {[o[p] if p < len(o) else None for p, o in zip(pos, orders)]}")
    return Timeline(tuple(busy), max(free) - (first or 0.0))


def _deps(act: Act, n_stages: int, done: dict) -> tuple[list, list]:
    """(same-rank inputs, other-stage inputs) of an action; None where a backward is not there yet."""
    kind, s, mb = act
    if kind == "F":
        return [], [("F", s - 1, mb)] if s > 0 else []
    if kind in ("B", "I"):
        return [("F", s, mb)], [_bwd(done, s + 1, mb)] if s < n_stages - 1 else []
    return [("I", s, mb)], []


def _sent(act: Act, end: float, r: int, rank_of: dict[int, int], n_stages: int,
          transfers: dict[tuple[str, int], float] | None, link: list[float]) -> float:
    """When an action's output, done at ``end`` on pp rank r, is at its consumer: at once on the
    same rank (or with free sends), else after its send, queued on r's link (``link[r]``, updated)."""
    kind, s, _ = act
    to = s + 1 if kind == "F" else s - 1 if kind in ("B", "I") else None
    if not transfers or to is None or not 0 <= to < n_stages or rank_of[to] == r:
        return end
    link[r] = max(link[r], end) + transfers[(kind, s)]
    return link[r]


def shared_window(orders: tuple[tuple[Act, ...], ...], work: dict[tuple[str, int], float],
                  wait: dict[tuple[str, int], float], transfers: dict[tuple[str, int], float] | None,
                  width: int, cores: int, busy_rate: float = 1.0) -> tuple[float, list[float]]:
    """The order run on cores that every rank shares (processor sharing): (the window, each pp rank's
    seconds of running). A pp rank stands for ``width`` ranks moving in step (its dp x tp); an
    action first needs ``work`` CPU-seconds of one rank, progressing at min(1, cores / ranks
    running) of a core (times ``busy_rate``, a core's speed while every core is busy, relative to
    one running alone), then sleeps ``wait`` seconds (its blocking collectives) off the cores;
    sends as ``simulate``'s (None: free). Rule of an OS scheduler that splits cores evenly
    among the runnable; it leaves out the cost of switching.
    """
    n_stages = 1 + max(s for order in orders for _, s, _ in order)
    rank_of = {s: r for r, order in enumerate(orders) for _, s, _ in order}
    done: dict[Act, float] = {}
    arrives: dict[Act, float] = {}
    pos, left = [0] * len(orders), [None] * len(orders)
    link, ran = [0.0] * len(orders), [0.0] * len(orders)
    t = 0.0
    while any(p < len(o) for p, o in zip(pos, orders)):
        for r, order in enumerate(orders):
            if left[r] is None and pos[r] < len(order):
                local, remote = _deps(order[pos[r]], n_stages, done)
                if all(d is not None and d in done and done[d] <= t for d in local) and all(
                        d is not None and d in arrives and arrives[d] <= t for d in remote):
                    kind, s, _ = order[pos[r]]
                    left[r] = [work[(kind, s)], wait[(kind, s)]]
        running = [r for r in range(len(orders)) if left[r] is not None and left[r][0] > 1e-12]
        sleeping = [r for r in range(len(orders)) if left[r] is not None and left[r][0] <= 1e-12]
        n = len(running) * width
        speed = min(1.0, cores / n) * (busy_rate if n >= cores > 1 else 1.0) if running else 0.0
        ends = [left[r][0] / speed for r in running] + [left[r][1] for r in sleeping]
        ends += [v - t for v in (*done.values(), *arrives.values()) if v > t + 1e-12]
        if not ends:
            raise RuntimeError(f"schedule order deadlocks at {[o[p] if p < len(o) else None for p, o in zip(pos, orders)]}")
        dt = min(ends)
        for r in running:
            left[r][0] -= dt * speed
            ran[r] += dt
        for r in sleeping:
            left[r][1] -= dt
        t += dt
        for r, order in enumerate(orders):
            if left[r] is not None and left[r][0] <= 1e-12 and left[r][1] <= 1e-12:
                act = order[pos[r]]
                done[act] = t
                arrives[act] = _sent(act, t, r, rank_of, n_stages, transfers, link)
                pos[r], left[r] = pos[r] + 1, None
    return t, ran


def _bwd(done: dict, stage: int, mb: int) -> Act | None:
    """The action whose end releases a stage's input grad: its B, else its I (None: neither yet)."""
    for kind in ("B", "I"):
        if (kind, stage, mb) in done:
            return (kind, stage, mb)
    return None


def peak_activations(order: tuple[Act, ...], microbatches: int, n_stages: int, saved: dict[int, int],
                     output: dict[int, int], inputs: dict[int, int]) -> int:
    """Peak activation bytes of one rank over its order; saved/output/inputs: per-microbatch bytes
    of each stage it holds (shapes.StageCost).

    Held, by what torch 2.13's pipelining keeps (matched against MemTracker, tests/test_plan.py):
    a microbatch's saved tensors and output from its F to its release (``in_flight``); every
    microbatch's received input for the whole step on a stage after the first (one receive
    buffer per microbatch); every microbatch's output on the last stage (the schedule merges
    them when the step ends). The peak is taken right after a forward.
    """
    _, after_f = in_flight(order)
    held = {s: microbatches * inputs[s] for s in saved if s > 0}
    held.update({n_stages - 1: held.get(n_stages - 1, 0) + microbatches * output[n_stages - 1]} if n_stages - 1 in saved else {})
    fixed = sum(held.values())
    per_mb = {s: saved[s] + (output[s] if s != n_stages - 1 else 0) for s in saved}
    return fixed + max((sum(n * per_mb[s] for s, n in h.items()) for h in after_f), default=0)
