"""The simulated device's memory: statistics of the rank's tensors, counted at the allocator's door,
and the verdicts a GPU gives at its capacity.

    python -c "import torch; from simcluster.launcher.instrument.gpu import memory; c = memory.start(2**30); x = torch.zeros(1000); print(c.allocated, c.peak, memory.KIND)"

Method (chosen by measurement, BENCHMARKS.md "The simulated GPU's memory at no cost per op"): the
simulated GPU's tensors are CPU tensors, and every CPU tensor's storage comes from torch's one CPU
allocator; gpu/counting_allocator.cpp, compiled into the trainer image (gpu/native.py), takes that
place (``c10::SetCPUAllocator``) in front of torch's own and counts each allocation and free with a
few atomics: no cost per op, exact for every storage (rounded up to CUDA's 512-byte block), from
every thread, inside ``torch.compile``d code too (its buffers, as a GPU's allocator counts them).
Where no library can be had, ``start`` falls back to counting per op (gpu/tracker.py) and says so.

What is counted: every CPU allocation of the rank's process from the moment the simulated GPU
starts, which on a GPU would be device memory, and also what a GPU program keeps on the CPU and
allocates with torch's CPU allocator in the rank's own process (a dataset or a batch made there, a
checkpoint loaded with ``map_location="cpu"``): the simulation cannot tell those apart at no cost,
since ``.to("cuda")`` hands back the same storage. Not counted: tensors in shared memory (a
DataLoader's worker processes hand their batches over in shared memory, and ``.to("cuda")`` of
such a batch copies nothing here, where a GPU would count the copy), tensors made before the
simulation started, and buffers libraries allocate outside torch (oneDNN's scratch, gloo's own).

The verdicts: an allocation that takes the allocated bytes above the device's capacity (the
``--gpu`` model's memory, ``--gpu-memory``, times ``set_per_process_memory_fraction``) raises
``torch.cuda.OutOfMemoryError`` with the CUDA caching allocator's message and numbers, so a
program's OOM handler runs; ``mem_get_info`` is never negative; ``caching_allocator_alloc`` and
``caching_allocator_delete`` work; the allocator's history (``_record_memory_history``,
``memory_snapshot``) is refused by name. ``memory_reserved`` is the high-water mark of allocated
bytes since the last ``empty_cache`` (a caching allocator that reuses freed blocks perfectly).
"""
from __future__ import annotations

import sys

COUNTER = None  # the rank's counter once started: gpu/native.py's NativeCounter, or gpu/tracker.py's Tracker
KIND = None  # "allocator" (compiled, no cost per op) or "per-op" (the fallback)
LIMIT = {"total": 0, "fraction": None}  # the device's capacity (bytes) and set_per_process_memory_fraction's
_RAW: dict = {}  # caching_allocator_alloc's blocks: pointer -> the tensor that holds it


def start(total: int):
    """Start counting this rank's tensors on a device of ``total`` bytes (idempotent); the counter."""
    global COUNTER, KIND
    if COUNTER is None:
        from simcluster.launcher.instrument.gpu.native import load
        COUNTER = load(total)
        KIND = "allocator"
        if COUNTER is None:
            from simcluster.launcher.instrument.gpu.tracker import make_tracker
            COUNTER, KIND = make_tracker(), "per-op"
            COUNTER.__enter__()
            print("[simcluster] simulated GPU memory counted per op (slower; no out-of-memory verdict): its "
                  "compiled allocator could not be built or loaded (g++ and torch's headers give it: python -m "
                  "simcluster.launcher.instrument.gpu.native --build)", file=sys.stderr, flush=True)
        from simcluster.launcher.instrument.gpu.state import STATE
        STATE.listeners.append(COUNTER.set_device)
        COUNTER.set_device(STATE.current)
    set_capacity(total)
    return COUNTER


def set_capacity(total: int, fraction: float | None = None) -> None:
    """The device's capacity in bytes and the fraction of it a process may allocate (None: all)."""
    LIMIT["total"], LIMIT["fraction"] = int(total), fraction
    if COUNTER is not None:
        COUNTER.set_limit(int(total), int((1.0 if fraction is None else fraction) * total), fraction is not None)


def peak_record() -> dict:
    """The step record's ``device_peak_mb``: the most bytes the rank's tensors held since the counter
    started, in MiB (not reset by ``reset_peak_memory_stats``)."""
    return {"device_peak_mb": round(COUNTER.run_peak / 2**20, 3)} if COUNTER else {}


def stats() -> dict:
    """torch.cuda.memory_stats' keys that the counter knows (bytes and counts; the pools' own are 0)."""
    c = COUNTER
    if c is None:
        return {}
    alloc, peak, total_alloc, freed = c.allocated, c.peak, c.total_allocated, c.total_freed
    count = c.count
    out = {}
    for pool in ("all", "large_pool", "small_pool"):
        whole = pool == "all"
        for kind, cur, top, a, f in (
                ("allocated_bytes", alloc, peak, total_alloc, freed), ("active_bytes", alloc, peak, total_alloc, freed),
                ("reserved_bytes", c.reserved, c.peak_reserved, c.peak_reserved, 0),
                ("requested_bytes", alloc, peak, total_alloc, freed),
                ("allocation", count, c.peak_count, c.total_count, c.total_count - count)):
            for k, v in (("current", cur), ("peak", top), ("allocated", a), ("freed", f)):
                out[f"{kind}.{pool}.{k}"] = v if whole else 0
    out.update({"num_alloc_retries": 0, "num_ooms": c.num_ooms, "num_sync_all_streams": 0,
                "num_device_alloc": 0, "num_device_free": 0})
    return dict(sorted(out.items()))


def mem_get_info(state, device=None) -> tuple[int, int]:
    """(free, total) bytes of the simulated device: total its capacity, free what the counter does not
    hold (never below 0)."""
    state.index(device)
    total = LIMIT["total"] or state.model.total_memory
    return max(0, total - (COUNTER.reserved if COUNTER else 0)), total


def _refused(name: str, fix: str):
    def refuse(*_a, **_k):
        raise RuntimeError(f"torch.cuda.memory.{name} is not simulated: simcluster's simulated GPU does not have the "
                           f"caching allocator's block history (it counts the bytes of the rank's tensors: "
                           f"memory_allocated, memory_stats). Fix: {fix}, or run with --no-simulated-gpus.")
    return refuse


def raw_functions(state) -> dict:
    """``caching_allocator_alloc``/``_delete`` (a block held by a uint8 tensor) and the history, refused."""
    import torch

    def alloc(size, device=None, stream=None):
        state.index(device)
        t = torch.empty(int(size), dtype=torch.uint8)
        _RAW[t.data_ptr()] = t
        return t.data_ptr()

    def delete(mem_ptr):
        if mem_ptr and _RAW.pop(int(mem_ptr), None) is None:
            raise RuntimeError(f"invalid device pointer: {mem_ptr:#x}")

    snapshot_fix = "leave your program's memory-snapshot option off here (torchtitan: --profiling.enable_memory_snapshot)"

    def record(enabled="all", *a, **k):
        if enabled not in (None, False):
            _refused("_record_memory_history", snapshot_fix)()

    return {"caching_allocator_alloc": alloc, "caching_allocator_delete": delete, "_record_memory_history": record,
            "_snapshot": _refused("_snapshot", snapshot_fix), "memory_snapshot": _refused("memory_snapshot", snapshot_fix),
            "_dump_snapshot": _refused("_dump_snapshot", snapshot_fix)}


def fraction_functions(state) -> dict:
    """``set_per_process_memory_fraction`` (torch's own type and range errors; the capacity becomes that
    fraction of the device's) and its getter."""

    def set_fraction(fraction, device=None):
        if not isinstance(fraction, float):  # torch's own checks and messages
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        state.index(device)
        set_capacity(LIMIT["total"] or state.model.total_memory, fraction)

    def get_fraction(device=None):
        state.index(device)
        return 1.0 if LIMIT["fraction"] is None else LIMIT["fraction"]

    return {"set_per_process_memory_fraction": set_fraction, "get_per_process_memory_fraction": get_fraction}


def functions(state) -> dict:
    """name -> the simulated memory function, for ``torch.cuda`` and ``torch.accelerator``."""

    def stat(attr):
        def f(device=None):
            state.index(device)
            return getattr(COUNTER, attr) if COUNTER else 0
        return f

    def reset_peak(device=None):
        state.index(device)
        if COUNTER:
            for top, cur in (("peak", "allocated"), ("peak_reserved", "reserved"), ("peak_count", "count")):
                COUNTER.set(top, getattr(COUNTER, cur))

    def reset_accumulated(device=None):
        state.index(device)
        for name in ("total_allocated", "total_freed", "total_count", "num_ooms") if COUNTER else ():
            COUNTER.set(name, 0)

    def empty_cache():
        if COUNTER:
            COUNTER.set("reserved", COUNTER.allocated)

    def memory_stats(device=None):
        state.index(device)
        return stats()

    def nested(device=None):
        out: dict = {}
        for key, value in memory_stats(device).items():
            *path, last = key.split(".")
            node = out
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return out

    def summary(device=None, abbreviated=False):
        s = memory_stats(device)
        return "\n".join(f"{k}: {v}" for k, v in s.items() if k.endswith(("all.current", "all.peak")))

    return {"memory_allocated": stat("allocated"), "max_memory_allocated": stat("peak"),
            "memory_reserved": stat("reserved"), "max_memory_reserved": stat("peak_reserved"),
            "memory_cached": stat("reserved"), "max_memory_cached": stat("peak_reserved"),
            "memory_stats": memory_stats, "memory_stats_as_nested_dict": nested, "memory_summary": summary, "reset_peak_memory_stats": reset_peak,
            "reset_max_memory_allocated": reset_peak, "reset_max_memory_cached": reset_peak,
            "reset_accumulated_memory_stats": reset_accumulated, "empty_cache": empty_cache,
            "mem_get_info": lambda device=None: mem_get_info(state, device),
            **fraction_functions(state), **raw_functions(state)}
