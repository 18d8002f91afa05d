"""The plan of a run: per rank its memory, traffic and schedule, the bubble; as a table or JSON.

    python -m launcher plan --mesh 2x2x2 --model small [--schedule 1f1b] [--microbatches N] [--json]
    python -c "from simcluster.train.plan.predict import plan; from simcluster.core.config import *; print(plan(resolve(Config(mesh='2x1x1'))).bubble)"

Everything is predicted from shapes and torch's schedule order (shapes.py, schedule.py,
traffic.py); nothing is run. Units: bytes, FLOPs; the table prints MB = 1e6 bytes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcluster.core.config import TrainRun
from simcluster.train.plan.schedule import in_flight, peak_activations, rank_orders, simulate
from simcluster.train.plan.shapes import stage_cost, state_bytes
from simcluster.train.plan.traffic import rank_traffic
from simcluster.train.split import stage_ids
from simcluster.core.timeline import textbook_bubble

LEFT_OUT = ("the CUDA caching allocator's fragmentation and the CUDA context; temporaries of the op "
            "running (MemTracker's TEMP: a layer's output grads during its backward); mixed precision (the "
            "trainer runs float32); communication time in the bubble")


@dataclass(frozen=True)
class RankPlan:
    """One rank. params/grads/optimizer/gathered/activations: bytes it holds (gathered: FSDP's
    unsharded parameters, shapes.state_bytes; activations: the peak over the step); in_flight: stage -> the most microbatches whose activations it holds at once; traffic:
    the accounting's shape (train/plan/traffic.py); flops: its forward + backward FLOPs a step."""

    rank: int
    coords: tuple[int, int, int]
    stages: tuple[int, ...]
    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    in_flight: dict[int, int]
    traffic: dict
    flops: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations


@dataclass(frozen=True)
class Plan:
    """A run's plan: the resolved run, every rank, the bubble of torch's order on a FLOP clock
    (schedule.simulate) and the textbook (p-1)/(m+p-1) where one exists (gpipe, 1f1b)."""

    run: TrainRun
    ranks: tuple[RankPlan, ...]
    bubble: float
    textbook_bubble: float | None


def plan(run: TrainRun) -> Plan:
    """The plan of a preflighted run (train.preflight.preflight)."""
    mesh, m = run.mesh, run.config.microbatches
    orders = rank_orders(run.config.schedule, mesh.pp, m, run.local_stages)
    ranks = []
    for rank in range(mesh.world_size):
        pp_rank = mesh.coords(rank)[0]
        stages = tuple(stage_ids(pp_rank, mesh.pp, run.local_stages, run.layout))
        costs = {s: stage_cost(run, s) for s in stages}
        act = peak_activations(orders[pp_rank], m, run.n_stages, {s: c.saved_bytes for s, c in costs.items()},
                               {s: c.output_bytes for s, c in costs.items()}, {s: c.input_bytes for s, c in costs.items()})
        held = state_bytes(run, rank)
        ranks.append(RankPlan(rank, mesh.coords(rank), stages, held["params"], held["grads"], held["optimizer"],
                              held["gathered"], act,
                              in_flight(orders[pp_rank])[0], rank_traffic(run, rank),
                              m * sum(c.fwd_flops + c.bwd_flops for c in costs.values())))
    durations = {}
    for s in range(run.n_stages):
        c = stage_cost(run, s)
        durations.update({("F", s): c.fwd_flops, ("B", s): c.bwd_flops, ("I", s): c.bwd_flops / 2,
                          ("W", s): c.bwd_flops / 2})
    bubble = simulate(orders, durations).bubble if mesh.pp > 1 else 0.0
    return Plan(run, tuple(ranks), bubble, textbook_bubble(run.config.schedule, run.n_stages, m) if mesh.pp > 1 else None)


def world_traffic(p: Plan) -> dict:
    """The step's traffic summed over ranks: {"bytes": {kind}, "messages": {kind}, "links": {link}}."""
    out: dict = {"bytes": {}, "messages": {}, "links": {}}
    for r in p.ranks:
        for part in out:
            for k, v in r.traffic[part].items():
                out[part][k] = out[part].get(k, 0) + v
    return out


def to_dict(p: Plan) -> dict:
    """The plan as plain JSON-able data (``--json``)."""
    run = p.run
    return {"mesh": str(run.mesh), "model": run.config.model, "shape": dataclasses.asdict(run.model),
            "schedule": run.config.schedule, "microbatches": run.config.microbatches,
            "microbatch_size": run.microbatch_size, "seq_len": run.config.seq_len, "stages": run.n_stages,
            "bubble": p.bubble, "textbook_bubble": p.textbook_bubble, "units": "bytes; flops; seconds (step_time)",
            "ranks": [{**{k: v for k, v in dataclasses.asdict(r).items() if k != "in_flight"},
                       "in_flight": {str(s): n for s, n in r.in_flight.items()}, "total": r.total} for r in p.ranks],
            "world_traffic": world_traffic(p), "left_out": LEFT_OUT}


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def to_text(p: Plan) -> str:
    """The per-rank table, the bubble, the world's traffic by kind and link, what is left out."""
    run = p.run
    lines = [f"plan {run.mesh} (pp x dp x tp), model {run.config.model} ({run.model.n_layers} layers, dim "
             f"{run.model.dim}), {run.config.schedule}, {run.config.microbatches} microbatches of "
             f"{run.microbatch_size} x {run.config.seq_len} tokens; predicted from shapes, nothing run",
             f"{'rank':>4} {'pp/dp/tp':>8} {'stages':>6} {'params':>8} {'grads':>8} {'optim':>8} {'gathered':>8} {'activ':>8} "
             f"{'total':>8} {'in flight':>9} {'sent':>8} {'GFLOP':>7}   (MB)"]
    for r in p.ranks:
        sent = sum(v for k, v in r.traffic["bytes"].items() if k != "pp_recv")
        flight = ",".join(str(r.in_flight.get(s, 0)) for s in r.stages)
        lines.append(f"{r.rank:>4} {'/'.join(map(str, r.coords)):>8} {','.join(map(str, r.stages)):>6} "
                     f"{_mb(r.params):>8} {_mb(r.grads):>8} {_mb(r.optimizer):>8} {_mb(r.gathered):>8} {_mb(r.activations):>8} "
                     f"{_mb(r.total):>8} {flight:>9} {_mb(sent):>8} {r.flops / 1e9:>7.2f}")
    book = f", textbook (p-1)/(m+p-1) {p.textbook_bubble:.3f}" if p.textbook_bubble is not None else ""
    lines.append(f"bubble {p.bubble:.3f} (torch's {run.config.schedule} order on a FLOP clock{book})")
    world = world_traffic(p)
    kinds = ", ".join(f"{k} {_mb(v)} MB/{world['messages'][k]}" for k, v in world["bytes"].items() if k != "pp_recv")
    links = ", ".join(f"{k} {_mb(v)} MB" for k, v in sorted(world["links"].items()))
    lines.append(f"traffic per step, all ranks: {kinds or 'none'}" + (f"; links {links}" if links else ""))
    lines.append(f"left out: {LEFT_OUT}")
    return "\n".join(lines)
