"""The full-size plan's answer: per rank run, memory (the allocator replay) and speed, as a table a
person reads or as JSON; what the run could not see, named.

    python -c "from simcluster.train.plan.fullsize.report import UNSEEN; print(*UNSEEN, sep='\\n')"

JSON: ``{"gpu", "expandable_segments", "ranks": [{"rank", "stands_for", "peak_allocated_gib",
"peak_reserved_gib", "device_peak_gib", "phase", "fits", "oom_by_gib", "step_s", "compute_s",
"comm_s", "tokens_per_s", "mfu", "seconds_here", "bubble", "schedule"}], "placeholders", "unseen", "sources"}``
(bubble: the pipeline's fraction, schedule.py; None without a pipeline).
"""
from __future__ import annotations

from dataclasses import dataclass

from simcluster.core.hardware import Hardware
from simcluster.train.plan.fullsize.device import CUBLAS_WORKSPACE, CUDA_CONTEXT, NCCL_PER_GROUP
from simcluster.train.plan.fullsize.memory import Memory
from simcluster.train.plan.fullsize.speed import Speed

GiB = 1 << 30
UNSEEN = (f"the CUDA context: not allocated by torch; estimated {CUDA_CONTEXT >> 20} MiB (device.py's source)",
          f"NCCL's buffers: estimated {NCCL_PER_GROUP >> 20} MiB a process group (device.py's source)",
          f"cuBLAS's workspace: {CUBLAS_WORKSPACE >> 20} MiB, torch's default on Hopper, replayed first",
          "workspaces inside a kernel (FlashAttention's, a custom CUDA or Triton kernel's): size unknown",
          "streams: a block's reuse waits for no event here (on a GPU, record_stream and events may hold a freed "
          "block longer; with --env TORCH_NCCL_AVOID_RECORD_STREAMS=0 tensor parallelism's collectives hold theirs "
          "for a launch queue of 1,000 ops, an assumption): reserved may be under the GPU's",
          "a pipeline's sends overlapping the other collectives: each on its own link, none sharing",
          "context parallel's ring: its K/V all-gathers and permutes are counted exposed (torch's ring waits for them "
          "after a block's attention, which may hide them), its attention at the single-GPU kernel's rate")


@dataclass(frozen=True)
class RankResult:
    """One rank run: its number, the ranks it stands for, its memory and speed (speed None: no
    optimizer step), seconds it took here, ops outside aten (custom kernels) it ran."""

    rank: int
    stands_for: tuple[int, ...]
    memory: Memory
    speed: Speed | None
    seconds: float
    custom_ops: tuple[str, ...]


def to_dict(results: list[RankResult], device: Hardware, expandable: bool, placeholders: dict) -> dict:
    """The JSON form (see the module docstring); sizes in GiB (2**30 bytes), rounded to 0.01."""
    ranks = []
    for r in results:
        m, s = r.memory, r.speed
        ranks.append({"rank": r.rank, "stands_for": list(r.stands_for),
                      "peak_allocated_gib": round(m.peak_allocated / GiB, 2),
                      "peak_reserved_gib": round(m.peak_reserved / GiB, 2),
                      "device_peak_gib": round(m.device_peak / GiB, 2),
                      "phase": m.oom_phase or m.phase_reserved, "fits": m.fits,
                      "oom_by_gib": round(max(m.oom_by, m.device_peak - m.capacity, 0) / GiB, 2),
                      "step_s": round(s.step_s, 4) if s else None, "compute_s": round(s.compute_s, 4) if s else None,
                      "comm_s": round(s.comm_s, 4) if s else None,
                      "tokens_per_s": round(s.tokens_per_s, 1) if s and s.tokens_per_s else None,
                      "mfu": round(s.mfu, 4) if s else None, "seconds_here": round(r.seconds, 1),
                      "bubble": round(s.bubble, 4) if s and s.bubble is not None else None,
                      "schedule": s.schedule if s else "",
                      "custom_ops": list(r.custom_ops)})
    unseen = list(UNSEEN) + [f"custom op {op}: its outputs counted, its workspace unknown"
                             for op in sorted({op for r in results for op in r.custom_ops})]
    return {"gpu": device.name, "memory_gib": round(device.memory / GiB, 2), "expandable_segments": expandable,
            "ranks": ranks, "placeholders": placeholders, "unseen": unseen, "sources": list(device.sources)}


def to_text(data: dict) -> str:
    """The table a person reads, from to_dict's data."""
    lines = [f"full-size plan on {data['gpu']} ({data['memory_gib']} GiB a GPU; allocator: "
             f"{'expandable segments' if data['expandable_segments'] else 'default segments'})",
             f"{'rank':>4}  {'stands for':<12} {'alloc GiB':>9} {'reserved':>9} {'device':>8}  {'verdict':<16} "
             f"{'step s':>7} {'tok/s/GPU':>9} {'MFU':>5}  peak phase"]
    for r in data["ranks"]:
        stands = _ranges(r["stands_for"])
        verdict = "fits" if r["fits"] else f"OOM by {r['oom_by_gib']:.2f} GiB"
        step = f"{r['step_s']:.3f}" if r["step_s"] is not None else "-"
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        mfu = f"{r['mfu']:.0%}" if r["mfu"] is not None else "-"
        lines.append(f"{r['rank']:>4}  {stands:<12} {r['peak_allocated_gib']:>9.2f} {r['peak_reserved_gib']:>9.2f} "
                     f"{r['device_peak_gib']:>8.2f}  {verdict:<16} {step:>7} {tps:>9} {mfu:>5}  {r['phase']}")
    piped = [r for r in data["ranks"] if r.get("bubble") is not None]
    if piped:
        lines.append(f"pipeline: {piped[0]['schedule']} order (torch's), bubble {piped[0]['bubble']:.3f} of the "
                     f"schedule's window, in the step time")
    lines.append("alloc/reserved: torch.cuda.max_memory_allocated/reserved as the caching allocator would report them; "
                 "device: reserved + CUDA context + NCCL buffers (the verdict's figure)")
    if data["placeholders"]:
        lines.append("answered with a placeholder (a fake tensor has no value; .item() gave 1, a flag False, allclose and "
                     "equal True):")
        lines += [f"  {line} x{n}" for line, n in data["placeholders"].items()]
    lines.append("not seen by the run:")
    lines += [f"  {u}" for u in data["unseen"]]
    return "\n".join(lines)


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)
