"""A full-size pipeline's step: each stage's compute per microbatch from its rank's trace, torch's
schedule order, the sends on the modelled links -> the step's window and its bubble.

    python -m pytest -q -n 0 tests/test_fullsize_agree.py -k bubble

Per traced pipeline rank, from the last complete step of its trace (speed.py's): the forward seconds
(ops in a forward phase, and outside the model after a forward: the loss) and the backward seconds (in
or after a backward) up to the rank's last op inside a module, each divided by the microbatches; the
tail (ops after it: clipping, the optimizer) runs once after the schedule. Ops are timed as speed.py
times them (event_op_s), and so are the functional collectives (speed.EXPOSED: tensor parallelism's,
waited by the next op on the compute stream): they count in the stage's forward, backward or tail
where they happen, never overlapped; only the c10d ones (FSDP's, DDP's) overlap the window. Each send's time on its
group's link (speed.collective_s). The order is torch's own (train/plan/schedule.py rank_orders:
the schedule classes' pipeline_order), run on that clock by schedule.simulate: an action starts when
its rank is free and its input arrived (the previous stage's forward, the next stage's backward, each
after its send on the sender's link); a split backward's I and W take half the backward each, and a
pp rank's forward (backward) seconds are shared equally by its forward (backward) actions. The bubble: simulate's (the mean over pp ranks of
the window's share without compute), as the analytic plan reports it. A pp rank with no trace of its
own takes the stood-for rank's seconds (the nearest traced pp rank below it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcluster.core.hardware import Hardware
from simcluster.train.plan.fullsize.speed import EXPOSED, Speed, collective_s, event_op_s, step_of
from simcluster.train.plan.fullsize.trace import Trace
from simcluster.train.plan.schedule import rank_orders, simulate

P2P = ("send", "recv")


@dataclass(frozen=True)
class StageTimes:
    """One pp rank's seconds: forward and backward a microbatch as its trace counts them (``microbatches``:
    forwards of an outermost module, so a microbatch of each local stage), the tail after its last
    microbatch, one send of its activations or gradients; its pp rank and pp size."""

    pp_rank: int
    pp: int
    forward_s: float
    backward_s: float
    tail_s: float
    send_s: float
    microbatches: int


@dataclass(frozen=True)
class Pipeline:
    """The schedule run: its name, pp, microbatches, the window (s: first start to last end of the
    schedule's actions), the bubble fraction (0..1), each pp rank's tail (s)."""

    schedule: str
    pp: int
    microbatches: int
    window_s: float
    bubble: float
    tails: tuple[float, ...]


def _backward(phase: str) -> bool:
    return ", backward " in phase or "after the backward of" in phase


def stage_times(trace: Trace, device: Hardware, efficiency: float) -> StageTimes | None:
    """The pp rank's seconds of ``trace``'s last step (None: the step has no send or recv: no pipeline)."""
    step = trace.steps
    in_step = [step_of(p) == step for p in trace.phases]
    p2p = [e for e in trace.events if e[0] == "c" and e[1] in P2P and in_step[e[5]]]
    if not p2p:
        return None
    group = sorted(p2p[0][4])
    ops = [(e[3], event_op_s(e, device, efficiency)) if e[0] == "op" else (e[5], collective_s(e[1], e[2], tuple(e[4]), device))
           for e in trace.events if (e[0] == "op" and in_step[e[3]]) or (e[0] == "c" and e[1] in EXPOSED and in_step[e[5]])]
    last_inside = max((i for i, (ph, _) in enumerate(ops) if ", microbatch " in trace.phases[ph]), default=-1)
    fwd = bwd = tail = 0.0
    for i, (ph, t) in enumerate(ops):
        if i > last_inside:
            tail += t
        elif _backward(trace.phases[ph]):
            bwd += t
        else:
            fwd += t
    mbs = {int(p.split(", microbatch ")[1].split(",")[0]) for p, here in zip(trace.phases, in_step)
           if here and ", microbatch " in p}
    m = max(mbs, default=1)
    sends = [collective_s("send", e[2], tuple(e[4]), device) for e in p2p if e[1] == "send"]
    return StageTimes(group.index(trace.rank), len(group), fwd / m, bwd / m, tail,
                      max(sends, default=0.0), m)


def pipeline(stages: list[StageTimes], schedule: str = "1f1b", local_stages: int = 1,
             microbatches: int | None = None) -> Pipeline:
    """torch's ``schedule`` order run on the stages' seconds (``microbatches``: the program's, else the
    count the traces show, divided by ``local_stages``).

    Raises:
        KeyError: ``schedule`` not one of simcluster.core.config.SCHEDULES.
    """
    pp = stages[0].pp
    by_rank = {s.pp_rank: s for s in stages}
    own = [by_rank.get(r) or by_rank[max((k for k in by_rank if k <= r), default=min(by_rank))] for r in range(pp)]
    m = microbatches or max(s.microbatches for s in stages) // local_stages
    orders = rank_orders(schedule, pp, m, local_stages)
    durations, transfers = {}, {}
    for r, order in enumerate(orders):
        st = own[r]
        for _, s, _ in order:
            actions = m * local_stages  # the rank's forwards (and backwards) of the step
            f, b = st.forward_s * st.microbatches / actions, st.backward_s * st.microbatches / actions
            durations.update({("F", s): f, ("B", s): b, ("I", s): b / 2, ("W", s): b / 2})
            transfers.update({("F", s): st.send_s, ("B", s): st.send_s, ("I", s): st.send_s})
    line = simulate(orders, durations, transfers)
    return Pipeline(schedule, pp, m, line.window, line.bubble, tuple(s.tail_s for s in own))


def pipelined(spd: Speed, trace: Trace, device: Hardware, pipe: Pipeline) -> Speed:
    """``spd`` (speed.speed's, of ``trace``) with the pipeline's step: the schedule's window plus this
    pp rank's tail, the c10d collectives (FSDP's, DDP's) overlapped with it as speed.py overlaps them
    with compute, plus the first of them (the functional ones, TP's, are in the stages' seconds);
    tokens/s and MFU on that step."""
    in_step = [step_of(p) == trace.steps for p in trace.phases]
    others = [collective_s(e[1], e[2], tuple(e[4]), device) for e in trace.events
              if e[0] == "c" and e[1] not in P2P and e[1] not in EXPOSED and in_step[e[5]]]
    p2p = next(e for e in trace.events if e[0] == "c" and e[1] in P2P and in_step[e[5]])
    tail = pipe.tails[sorted(p2p[4]).index(trace.rank)]
    step = max(pipe.window_s + tail, sum(others)) + (others[0] if others else 0.0)
    return dataclasses.replace(spd, step_s=step, exposed_comm_s=max(0.0, step - spd.compute_s),
                               tokens_per_s=spd.tokens / step if spd.tokens else None,
                               mfu=spd.flops / (step * device.bf16_flops), bubble=pipe.bubble, schedule=pipe.schedule)


def step_speeds(traces: dict[int, Trace], device: Hardware, efficiency: float, schedule: str = "1f1b",
                local_stages: int = 1, microbatches: int | None = None) -> dict[int, Speed | None]:
    """Each trace's Speed (None: no optimizer step), pipelined where its step sends and receives.
    The traces of one pipeline (the same pp group) are run through ``schedule`` together."""
    from simcluster.train.plan.fullsize.speed import speed

    out = {r: speed(t, device, efficiency) if t.steps else None for r, t in traces.items()}
    stages = {r: stage_times(t, device, efficiency) for r, t in traces.items() if out[r] is not None}
    stages = {r: s for r, s in stages.items() if s is not None}
    if stages:
        pipe = pipeline(list({s.pp_rank: s for s in stages.values()}.values()), schedule, local_stages, microbatches)
        for r in stages:
            out[r] = pipelined(out[r], traces[r], device, pipe)
    return out
