"""A full-size rank's memory as the GPU reports it: its trace replayed through the caching allocator
model, the cuBLAS workspace first; the CUDA context and NCCL's buffers added for the verdict.

    python -m pytest -q -n 0 tests/test_fullsize.py -k tiny_run

Peak allocated and peak reserved are torch.cuda.max_memory_allocated / max_memory_reserved's
figures (the allocator's own); ``device_peak`` adds what torch does not see (device.py's sources)
and is what the verdict compares with the --gpu model's memory. A replay that passes the capacity
stops there: OOM at that phase, by how much.

``record_streams`` (TORCH_NCCL_AVOID_RECORD_STREAMS=0, torch's default before 2025: pytorch issue
147168; torchtitan's composability notes, "Setting TORCH_NCCL_AVOID_RECORD_STREAMS=1 for TP"): the
process group calls ``record_stream`` on the input and output tensors of an async collective (the
functional ones DTensor issues for tensor parallelism; FSDP2's synchronous c10d ones skip it), and
the caching allocator reuses such a block only once the collective has finished on the GPU. The CPU
of a GPU-bound step runs ahead of the GPU by the launch queue: LAUNCH_QUEUE kernels (device.py's
source), so a block freed by the program stays held until that many ops after its collective; a
request the device cannot hold first waits for every held block (the allocator's
synchronize_and_free_events before it releases cached segments).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from simcluster.train.plan.fullsize.allocator import Allocator, OutOfMemory
from simcluster.core.hardware import Hardware
from simcluster.train.plan.fullsize.device import CUBLAS_WORKSPACE, CUDA_CONTEXT, LAUNCH_QUEUE, NCCL_PER_GROUP
from simcluster.train.plan.fullsize.speed import EXPOSED
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


def replay(trace: Trace, device: Hardware, expandable: bool = False, record_streams: bool = False,
           queue: int = LAUNCH_QUEUE) -> Memory:
    """Replay ``trace``'s allocations and frees in order on ``device`` (see the module docstring;
    ``queue``: the ops the CPU runs ahead of the GPU, with ``record_streams``)."""
    groups = len({tuple(e[4]) for e in trace.events if e[0] == "c" and e[3] > 1})
    outside = CUDA_CONTEXT + NCCL_PER_GROUP * groups
    alloc = Allocator(capacity=max(int(device.memory) - outside, 0), expandable=expandable)
    alloc.malloc(CUBLAS_WORKSPACE)
    live: dict[int, object] = {}
    held: dict[int, int] = {}  # sid -> the op count at which its collective is done on the GPU
    pending: list[tuple[int, int, object]] = []  # (op count, sid, block) freed by the program, still held
    ops = 0
    peak_a = peak_r = (0, 0)
    oom_by, oom_phase = 0, None
    for e in trace.events:
        kind = e[0]
        if kind in ("op", "c"):
            ops += 1
            if record_streams and kind == "c" and e[1] in EXPOSED and len(e) > 6:
                held.update((sid, ops + queue) for sid in e[6])
            while pending and pending[0][0] <= ops:
                alloc.free(heapq.heappop(pending)[2])
            continue
        if kind not in ("a", "f", "r"):
            continue
        try:
            if kind == "f" or kind == "r":
                b = live.pop(e[1], None)
                done = held.pop(e[1], 0)
                if b is not None and kind == "f" and done > ops:
                    heapq.heappush(pending, (done, e[1], b))
                elif b is not None:
                    alloc.free(b)
            if kind in ("a", "r") and e[2] > 0:
                live[e[1]] = _malloc(alloc, e[2], e[4] if len(e) > 4 else 0, pending)
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


def _malloc(alloc: Allocator, nbytes: int, stream: int, pending: list) -> object:
    """alloc.malloc; past the capacity with blocks still held for a collective, every held block
    freed first (the GPU synchronized) and the request tried again."""
    try:
        return alloc.malloc(nbytes, stream)
    except OutOfMemory:
        if not pending:
            raise
        while pending:
            alloc.free(heapq.heappop(pending)[2])
        return alloc.malloc(nbytes, stream)
