"""A full-size rank's memory as the GPU reports it: its trace replayed through the caching allocator
model, the cuBLAS workspace first; the CUDA context and NCCL's buffers added for the verdict.

    python -m pytest -q -n 0 tests/test_fullsize.py -k tiny_run

Peak allocated and peak reserved are torch.cuda.max_memory_allocated / max_memory_reserved's
figures (the allocator's own); ``device_peak`` adds what torch does not see (device.py's sources)
and is what the verdict compares with the --gpu model's memory. A replay that passes the capacity
stops there: OOM at that phase, by how much.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcluster.train.plan.fullsize.allocator import Allocator, OutOfMemory
from simcluster.core.hardware import Hardware
from simcluster.train.plan.fullsize.device import CUBLAS_WORKSPACE, CUDA_CONTEXT, NCCL_PER_GROUP
from simcluster.train.plan.fullsize.trace import Trace


@dataclass(frozen=True)
class Memory:
    """One rank's memory (bytes). phase_*: the phase names of the peaks; oom_by: bytes missing at
    the OOM (0: it fits), oom_phase its phase; outside: the context and NCCL bytes beside torch's."""

    peak_allocated: int
    peak_reserved: int
    phase_allocated: str
    phase_reserved: str
    outside: int
    groups: int
    device_peak: int
    capacity: int
    oom_by: int
    oom_phase: str | None
    segments: int
    retries: int

    @property
    def fits(self) -> bool:
        """No OOM, and the device's peak within its memory."""
        return self.oom_by == 0 and self.device_peak <= self.capacity


def replay(trace: Trace, device: Hardware, expandable: bool = False) -> Memory:
    """Replay ``trace``'s allocations and frees in order on ``device`` (see the module docstring)."""
    groups = len({tuple(e[4]) for e in trace.events if e[0] == "c" and e[3] > 1})
    outside = CUDA_CONTEXT + NCCL_PER_GROUP * groups
    alloc = Allocator(capacity=max(int(device.memory) - outside, 0), expandable=expandable)
    alloc.malloc(CUBLAS_WORKSPACE)
    live: dict[int, object] = {}
    peak_a = peak_r = (0, 0)
    oom_by, oom_phase = 0, None
    for e in trace.events:
        kind = e[0]
        if kind not in ("a", "f", "r"):
            continue
        try:
            if kind == "f" or kind == "r":
                b = live.pop(e[1], None)
                if b is not None:
                    alloc.free(b)
            if kind in ("a", "r") and e[2] > 0:
                live[e[1]] = alloc.malloc(e[2], e[4] if len(e) > 4 else 0)
        except OutOfMemory as oom:
            oom_by = oom.reserved + oom.needed - oom.capacity
            oom_phase = trace.phases[e[2] if kind == "f" else e[3]]
            break
        ph = e[2] if kind == "f" else e[3]
        if alloc.allocated > peak_a[0]:
            peak_a = (alloc.allocated, ph)
        if alloc.reserved > peak_r[0]:
            peak_r = (alloc.reserved, ph)
    names = trace.phases
    return Memory(alloc.peak_allocated, alloc.peak_reserved, names[peak_a[1]] if names else "",
                  names[peak_r[1]] if names else "", outside, groups, alloc.peak_reserved + outside,
                  int(device.memory), oom_by, oom_phase, alloc.mallocs, alloc.retries)
