"""The built-in trainer's full-size plan against today's analytic planner (`launcher plan`), rank by rank.

    python -m bench.fullsize_agree            # the table of BENCHMARKS.md, "Full size against the analytic plan"
    python -m pytest -q -n 0 tests/test_fullsize_agree.py

Both plan one run of the built-in trainer on one GPU model; they differ by method (the analytic plan
from shapes, the full-size plan from the program's own ops), so they are compared where their models
mean the same thing:

- memory: the analytic rank's total (params + grads + optimizer + FSDP's gathered + peak activations)
  against the full-size peak allocated less cuBLAS's workspace (which the analytic plan leaves out).
  The analytic plan leaves out the temporaries of the op running (its LEFT_OUT), so the full-size
  figure is the larger: they agree when full-size / analytic is within [1 - MEMORY_BELOW, 1 + MEMORY_ABOVE];
- FLOPs: the rank's forward + backward FLOPs a step, the analytic plan's FlopCounterMode count of a
  fake forward and backward against the recorder's count of the ops run, attention included in both
  (one count: train/plan/flops.py, the CPU attention kernels by their CUDA twins' formulas, a causal
  mask halving them); within FLOPS_TOLERANCE;
- step time on the FLOP clock: the analytic step (each op's FLOPs at the datasheet peak, every
  message exposed, the bubble, the optimizer at the memory bandwidth) against the full-size step on
  the same clock (MATMUL_EFFICIENCY 1.0 and no op bound by its bytes, as the analytic plan counts),
  with the schedule's bubble (schedule.py): within STEP_TOLERANCE, the full-size step overlapping
  FSDP's and TP's collectives with compute where the analytic plan exposes all of them;
- the bubble: torch's order of the same schedule on both FLOP clocks, sends free in both (the
  analytic bubble leaves communication out): within BUBBLE_TOLERANCE (absolute), the full-size one
  timing each stage's own ops (the last stage's loss, the first's embedding). The full-size bubble
  with its sends on the links is printed beside (``sent``): a send's latency is a sizable part of a
  small stage's forward;
- the full-size step as it predicts (ops bound by their bytes too) is printed beside, not held to a
  tolerance: on these small models the float32 elementwise ops' bytes outweigh the matmuls' FLOPs,
  which the analytic plan does not time (its LEFT_OUT), so it is the larger by 2-3x.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcluster.core.config import TrainRun
from simcluster.core.hardware import Hardware
from simcluster.train.plan.fullsize.device import CUBLAS_WORKSPACE, MATMUL_EFFICIENCY
from simcluster.train.plan.fullsize.memory import replay
from simcluster.train.plan.fullsize.schedule import step_speeds
from simcluster.train.plan.fullsize.speed import step_of
from simcluster.train.plan.fullsize.trace import Trace
from simcluster.train.plan.predict import plan
from simcluster.train.plan.steptime import step_time

MEMORY_BELOW = 0.02  # the full-size peak holds every tensor the analytic total counts; 2% for rounding to 512 B
MEMORY_ABOVE = 0.25  # the op running's temporaries (a layer's output grads in its backward, the loss's logits)
FLOPS_TOLERANCE = 0.05  # both count matmuls and attention; the analytic plan's closed forms leave out the norms
STEP_TOLERANCE = 0.25  # the full-size step overlaps FSDP's/TP's collectives the analytic plan exposes
BUBBLE_TOLERANCE = 0.03  # each stage's own ops (the last stage's loss) where the analytic clock splits FLOPs


@dataclass(frozen=True)
class Agreement:
    """One rank: bytes (analytic total, full-size peak allocated less the cuBLAS workspace), FLOPs a
    step, step seconds (analytic; full-size at the datasheet peak), the full-size bubble fraction."""

    rank: int
    analytic_bytes: int
    fullsize_bytes: int
    analytic_flops: int
    fullsize_flops: int
    analytic_step_s: float
    fullsize_step_s: float
    analytic_bubble: float
    fullsize_bubble: float  # sends free, as the analytic bubble
    sent_bubble: float  # the full-size bubble with its sends on the links (FLOP clock)
    predicted_step_s: float  # the full-size step as `plan --full-size` predicts it (bytes-bound ops, efficiency)

    @property
    def memory_ratio(self) -> float:
        return self.fullsize_bytes / self.analytic_bytes

    @property
    def flops_ratio(self) -> float:
        return self.fullsize_flops / self.analytic_flops

    @property
    def step_ratio(self) -> float:
        return self.fullsize_step_s / self.analytic_step_s

    def misses(self) -> list[str]:
        """What falls outside the tolerances above, said in words (empty: they agree)."""
        out = []
        if not 1 - MEMORY_BELOW <= self.memory_ratio <= 1 + MEMORY_ABOVE:
            out.append(f"rank {self.rank}: memory full-size/analytic {self.memory_ratio:.3f} outside "
                       f"[{1 - MEMORY_BELOW}, {1 + MEMORY_ABOVE}]")
        if abs(self.flops_ratio - 1) > FLOPS_TOLERANCE:
            out.append(f"rank {self.rank}: FLOPs full-size/analytic {self.flops_ratio:.3f} beyond {FLOPS_TOLERANCE:.0%}")
        if abs(self.step_ratio - 1) > STEP_TOLERANCE:
            out.append(f"rank {self.rank}: step full-size/analytic {self.step_ratio:.3f} beyond {STEP_TOLERANCE:.0%}")
        if abs(self.fullsize_bubble - self.analytic_bubble) > BUBBLE_TOLERANCE:
            out.append(f"rank {self.rank}: bubble {self.fullsize_bubble:.3f} against {self.analytic_bubble:.3f}, "
                       f"beyond {BUBBLE_TOLERANCE}")
        return out


def agreement(run: TrainRun, traces: dict[int, Trace], device: Hardware) -> list[Agreement]:
    """Each traced rank of ``run`` (preflighted) against the analytic plan of the same run on ``device``.

    Raises:
        ValueError: a trace without a complete step (speed's).
    """
    p = plan(run)
    _, times = step_time(p, device)
    by_rank = {t.rank: t for t in times}
    pipe = (run.config.schedule, run.local_stages, run.config.microbatches)
    flop_clock = step_speeds(traces, dataclasses.replace(device, memory_bw=float("inf")), 1.0, *pipe)
    free = dataclasses.replace(device, memory_bw=float("inf"), intra_bw=float("inf"), inter_bw=float("inf"),
                               latency_s=0.0)
    unsent = step_speeds(traces, free, 1.0, *pipe)
    predicted = step_speeds(traces, device, MATMUL_EFFICIENCY, *pipe)
    out = []
    for rank, trace in sorted(traces.items()):
        r, s = p.ranks[rank], flop_clock[rank]
        mem = replay(trace, device)
        out.append(Agreement(rank, r.total, mem.peak_allocated - CUBLAS_WORKSPACE, r.flops, _step_flops(trace),
                             by_rank[rank].total, s.step_s, p.bubble, unsent[rank].bubble or 0.0,
                             s.bubble or 0.0, predicted[rank].step_s))
    return out


def _step_flops(trace: Trace) -> int:
    """The FLOPs of the trace's last step, attention included (see the module docstring)."""
    in_step = [step_of(p) == trace.steps for p in trace.phases]
    return sum(e[1] for e in trace.events if e[0] == "op" and in_step[e[3]])


def to_text(rows: list[Agreement]) -> str:
    """The comparison as table rows (MB = 1e6 bytes, GFLOP, ms; step: on the FLOP clock, then as predicted)."""
    lines = [f"{'rank':>4} {'mem MB an.':>10} {'full':>8} {'ratio':>6} {'GFLOP an.':>10} {'full':>8} {'ratio':>6} "
             f"{'step ms an.':>11} {'full':>8} {'ratio':>6} {'bubble an.':>10} {'full':>6} {'sent':>6} {'predicted ms':>12}"]
    for a in rows:
        lines.append(f"{a.rank:>4} {a.analytic_bytes / 1e6:>10.2f} {a.fullsize_bytes / 1e6:>8.2f} {a.memory_ratio:>6.3f} "
                     f"{a.analytic_flops / 1e9:>10.2f} {a.fullsize_flops / 1e9:>8.2f} {a.flops_ratio:>6.3f} "
                     f"{a.analytic_step_s * 1e3:>11.3f} {a.fullsize_step_s * 1e3:>8.3f} {a.step_ratio:>6.3f} "
                     f"{a.analytic_bubble:>10.3f} {a.fullsize_bubble:>6.3f} {a.sent_bubble:>6.3f} {a.predicted_step_s * 1e3:>12.3f}")
    return "\n".join(lines)
