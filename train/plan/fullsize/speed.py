"""A full-size rank's step time on a --gpu model, from its own recorded ops and collectives.

    python -m pytest -q -n 0 tests/test_fullsize.py -k tiny_run

Method (docs/plan.md, "Full size"): the last complete step of the trace (the ops between the
last two optimizer steps). Each op takes max(FLOPs / (tensor-core peak x MATMUL_EFFICIENCY),
bytes / (memory bandwidth x BANDWIDTH_EFFICIENCY)); an op whose first input is float32 runs at the
FP32 peak (torch's default: no TF32 for matmuls); an attention op (FlashAttention's forward or
backward) runs at FlashAttention-2's measured rate on the GPU where device.py has one (ATTENTION_RATE). Each collective takes the ring's time on its
group's link: NVLink when every rank of the group is on one host (ranks_per_node GPUs a host, rank
r on host layout.node_of(r, ranks_per_node)), else each GPU's network port; all-gather (g-1)/g x output bytes,
reduce-scatter (g-1)/g x input bytes, each plus (g-1) latencies; an all-reduce twice both (the ring's
reduce-scatter then its all-gather: Thakur et al. 2005, as train/plan/steptime.py prices it). FSDP and DDP
overlap their collectives (torch.distributed's c10d ops: allgather_base, reduce_scatter_base,
allreduce) with compute on their own CUDA streams: the step is max(compute, overlapped
communication) plus the first such collective of the step (nothing to hide it behind). The
functional collectives (torch's _c10d_functional: all_gather_into_tensor, reduce_scatter_tensor,
all_reduce, all_to_all_single), which DTensor's redistributions issue (tensor parallelism's
sequence-parallel all-gathers and reduce-scatters, the loss parallel's and the gradient norm's
all-reduces), are waited for by the very next op that reads their output: they are exposed, added
to compute (the reason AsyncTP exists: torchtitan's benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md,
1.09x on 70B bf16 from overlapping them). Context parallel's ring (ring.py: its K/V all-gather, a ring
all-gather of the output's bytes; its permutes, each a send of the input's bytes to one peer) is
functional too and counted exposed, an upper bound: torch's ring waits for the K/V after the rank's
own block's attention, which could hide it (2.4-3.9% of torchtitan's CP 2-8 rows' steps: BENCHMARKS.md). Tokens are the
indices the step's forward embeddings looked up. Not modelled here: kernel launch
overheads, the optimizer step's host synchronisation. With a pipeline, schedule.py's
pipelined() replaces the step by the schedule's window (its bubble) plus the tail. Tokens a GPU: the rank's tokens x dp / world,
dp being the largest group of the step's reduce-scatters and all-reduces (FSDP's, DDP's, the loss's):
the other ranks (tensor parallel) share a data-parallel rank's tokens, as torchtitan counts; context
parallel's ranks each look up their own shard of the sequence and sit inside FSDP's group (torchtitan
shards over dp_shard x cp), so they count once each.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcluster.core.layout import node_of
from simcluster.core.hardware import Hardware
from simcluster.train.plan.fullsize.device import ATTENTION_RATE, BANDWIDTH_EFFICIENCY, MATMUL_EFFICIENCY
from simcluster.train.plan.fullsize.ring import CP_GATHER, CP_PERMUTE
from simcluster.train.plan.fullsize.trace import Trace

RING = {"allgather_base": 1.0, "allgather": 1.0, "all_gather_into_tensor": 1.0, "reduce_scatter_base": 1.0,
        "reduce_scatter": 1.0, "reduce_scatter_tensor": 1.0, "allreduce": 2.0, "all_reduce": 2.0,
        "alltoall_base": 1.0, "all_to_all_single": 1.0, CP_GATHER: 1.0}
LATENCIES = {"allreduce": 2, "all_reduce": 2}  # ring steps a collective takes, in units of (g - 1); 1 unless named
POINT = ("send", "recv", "broadcast", CP_PERMUTE)
EXPOSED = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_to_all_single", CP_GATHER,
           CP_PERMUTE)  # functional
GRADIENT = ("reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor", "allreduce", "all_reduce")


@dataclass(frozen=True)
class Speed:
    """One rank's step (seconds), its parts, the tokens it processed, tokens/s and MFU (0..1: the
    step's counted FLOPs, recomputation included, over the step time at the bf16 dense peak)."""

    step_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    flops: int
    tokens: int
    tokens_per_s: float | None
    mfu: float
    pipeline: bool
    step: int
    bubble: float | None = None  # a pipeline's bubble fraction (schedule.py), None without one
    schedule: str = ""  # the pipeline schedule whose order timed the step ("" without one)


def step_of(name: str) -> int:
    """The step number a phase name starts with ("step 2, ...")."""
    return int(name.split(",")[0].split()[1])


def collective_s(kind: str, nbytes: int, ranks: tuple, device: Hardware) -> float:
    """Seconds of one collective of ``kind`` over ``ranks`` moving ``nbytes`` (see the module docstring)."""
    g = len(ranks)
    if g <= 1:
        return 0.0
    one_host = len({node_of(r, device.ranks_per_node) for r in ranks}) == 1
    bw = device.intra_bw if one_host else device.inter_bw
    if kind in POINT:
        return nbytes / bw + device.latency_s
    factor = RING.get(kind, 0.0)
    return factor * (g - 1) / g * nbytes / bw + LATENCIES.get(kind, 1) * (g - 1) * device.latency_s


def op_s(flops: int, nbytes: int, fp32: bool, device: Hardware, efficiency: float = MATMUL_EFFICIENCY) -> float:
    """Seconds of one op on ``device``: the slower of its FLOPs and its bytes at their efficiencies."""
    peak = device.flops if fp32 else device.bf16_flops
    return max(flops / (peak * efficiency), nbytes / (device.memory_bw * BANDWIDTH_EFFICIENCY))


def event_op_s(e: tuple, device: Hardware, efficiency: float = MATMUL_EFFICIENCY) -> float:
    """Seconds of one recorded ``("op", flops, bytes, phase, fp32, name)`` event on ``device``: a bf16/fp16
    attention at its measured rate where device.py has one (still bound by its bytes), else op_s (a
    float32 attention too: FlashAttention has no float32 kernel, SDPA takes a matmul-based one)."""
    wide = bool(e[4]) if len(e) > 4 else False
    rate = ATTENTION_RATE.get(device.name, {}).get(e[5]) if len(e) > 5 and not wide else None
    if rate:
        return max(e[1] / rate, e[2] / (device.memory_bw * BANDWIDTH_EFFICIENCY))
    return op_s(e[1], e[2], wide, device, efficiency)


def speed(trace: Trace, device: Hardware, efficiency: float = MATMUL_EFFICIENCY) -> Speed:
    """The step time of ``trace``'s last complete step on ``device`` (``efficiency``: the matmuls'
    fraction of the tensor-core peak; bench/fullsize.py fits it).

    Raises:
        ValueError: the trace holds no complete step (the program made no optimizer step).
    """
    if trace.steps < 1:
        raise ValueError("no optimizer step in the run: nothing to time")
    step = trace.steps
    in_step = [step_of(p) == step for p in trace.phases]
    compute = comm = first = waited = 0.0
    flops = tokens = 0
    pipeline = False
    for e in trace.events:
        kind = e[0]
        if kind == "op" and in_step[e[3]]:
            compute += event_op_s(e, device, efficiency)
            flops += e[1]
        elif kind == "c" and in_step[e[5]]:
            t = collective_s(e[1], e[2], tuple(e[4]), device)
            pipeline = pipeline or e[1] in ("send", "recv")
            if e[1] in EXPOSED:
                waited += t
                continue
            first = first or t
            comm += t
        elif kind == "tok" and in_step[e[2]]:
            tokens += e[1]
    dp = max((e[3] for e in trace.events if e[0] == "c" and e[1] in GRADIENT and in_step[e[5]]), default=1)
    tokens = tokens * dp // trace.world_size  # the ranks outside data parallelism (tp, cp) share their tokens
    step_s = max(compute + waited, comm) + first
    return Speed(step_s, compute, comm + waited, step_s - compute, flops, tokens,
                 tokens / step_s if tokens and step_s else None,
                 flops / (step_s * device.bf16_flops) if step_s else 0.0, pipeline, step)
