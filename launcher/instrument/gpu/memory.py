"""The simulated device's memory statistics, counted from the rank's own tensors.

    python -c "import torch; from simcluster.launcher.instrument.gpu.memory import make_tracker; t = make_tracker(); t.__enter__(); x = torch.zeros(1000); t.__exit__(None, None, None); print(t.allocated, t.peak)"

Method: one ``TorchDispatchMode`` (``Tracker``) sees the outputs of every aten op the rank runs
in its main thread; each output's storage (a wrapper subclass's, as DTensor's, through its inner
tensors) not seen before is counted, its size rounded up to CUDA's 512-byte block, and a
``weakref.finalize`` on the storage subtracts it when torch frees it. So ``memory_allocated`` is the
bytes of live tensor storages created since the tracker started (at torch's import, before the
user's code made a tensor); ``max_memory_allocated`` its high-water mark since the last
``reset_peak_memory_stats``. Differences from CUDA's caching allocator: no workspace or temporary
buffers inside one op (a kernel's scratch), no tensors made in other threads (a DataLoader's
workers, a pin-memory thread), no intermediates inside ``torch.compile``d code (the mode steps aside
while torch compiles: ``ignore_compile_internals``); ``memory_reserved`` is the
high-water mark of allocated bytes since the last ``empty_cache`` (a caching allocator that
reuses freed blocks perfectly: no fragmentation, no 2 MiB segments). The cost per op is in
BENCHMARKS.md (``python -m bench.gpu_memory``).
"""
from __future__ import annotations

import weakref

BLOCK = 512  # CUDA caching allocator's kMinBlockSize: every allocation rounds up to it


def _round(n: int) -> int:
    return -(-n // BLOCK) * BLOCK if n else 0


def make_tracker():
    """A new Tracker (its class needs torch, imported here)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_flatten

    class Tracker(TorchDispatchMode):
        """Counts the live storages of the tensors the rank's ops return (see the module's docstring)."""

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            """Off while torch.compile compiles, on while its compiled code runs: compile works."""
            return True

        def __init__(self):
            super().__init__()
            self.allocated = self.peak = self.reserved = self.peak_reserved = self.run_peak = 0
            self.total_allocated = self.total_freed = self.count = self.total_count = 0
            self.seen: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if type(out) is torch.Tensor:
                self.track(out)
            elif out is not None:
                for t in (out if type(out) in (tuple, list) else tree_flatten(out)[0]):
                    if isinstance(t, torch.Tensor):
                        self.track(t)
            return out

        def track(self, t) -> None:
            if type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t):
                for name in t.__tensor_flatten__()[0]:
                    inner = getattr(t, name, None)
                    if isinstance(inner, torch.Tensor):
                        self.track(inner)
                return
            if not t.is_cpu or t.is_sparse or t.is_nested:
                return
            s = t.untyped_storage()
            key = s._cdata
            if key in self.seen:
                return
            n = _round(s.nbytes())
            self.seen.add(key)
            weakref.finalize(s, self.free, key, n)
            self.allocated += n
            self.total_allocated += n
            self.count += 1
            self.total_count += 1
            if self.allocated > self.peak:
                self.peak = self.allocated
                self.run_peak = max(self.run_peak, self.peak)
            if self.allocated > self.reserved:
                self.reserved = self.allocated
                self.peak_reserved = max(self.peak_reserved, self.reserved)

        def free(self, key: int, n: int) -> None:
            self.seen.discard(key)
            self.allocated -= n
            self.total_freed += n
            self.count -= 1

        def stats(self) -> dict:
            """torch.cuda.memory_stats' keys that the tracker knows (bytes and counts)."""
            out = {}
            for pool in ("all", "large_pool", "small_pool"):
                whole = pool == "all"
                for kind, cur, peak, alloc, freed in (
                        ("allocated_bytes", self.allocated, self.peak, self.total_allocated, self.total_freed),
                        ("active_bytes", self.allocated, self.peak, self.total_allocated, self.total_freed),
                        ("reserved_bytes", self.reserved, self.peak_reserved, self.reserved, 0),
                        ("requested_bytes", self.allocated, self.peak, self.total_allocated, self.total_freed),
                        ("allocation", self.count, self.count, self.total_count, self.total_count - self.count)):
                    for k, v in (("current", cur), ("peak", peak), ("allocated", alloc), ("freed", freed)):
                        out[f"{kind}.{pool}.{k}"] = v if whole else 0
            out.update({"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                        "num_device_alloc": 0, "num_device_free": 0})
            return dict(sorted(out.items()))

    return Tracker()


TRACKER = None  # the rank's Tracker once started (start())


def start():
    """Start counting this rank's tensors (idempotent); returns the tracker."""
    global TRACKER
    if TRACKER is None:
        TRACKER = make_tracker()
        TRACKER.__enter__()
    return TRACKER


def peak_record() -> dict:
    """The step record's ``device_peak_mb``: the most bytes the rank's tensors held since the tracker
    started, in MiB (not reset by ``reset_peak_memory_stats``)."""
    return {"device_peak_mb": round(TRACKER.run_peak / 2**20, 3)} if TRACKER else {}


def _t():
    return TRACKER


def mem_get_info(state, device=None) -> tuple[int, int]:
    """(free, total) bytes of the simulated device: total the model's, free what the tracker does not hold."""
    state.index(device)
    total = state.model.total_memory
    return total - (_t().reserved if _t() else 0), total


def functions(state) -> dict:
    """name -> the simulated memory function, for ``torch.cuda`` and ``torch.accelerator``."""

    def stat(attr):
        def f(device=None):
            state.index(device)
            return getattr(_t(), attr) if _t() else 0
        return f

    def reset_peak(device=None):
        state.index(device)
        if _t():
            _t().peak, _t().peak_reserved = _t().allocated, _t().reserved

    def empty_cache():
        if _t():
            _t().reserved = _t().allocated

    def memory_stats(device=None):
        state.index(device)
        return _t().stats() if _t() else {}

    def summary(device=None, abbreviated=False):
        s = memory_stats(device)
        return "\n".join(f"{k}: {v}" for k, v in s.items() if k.endswith(("all.current", "all.peak")))

    return {"memory_allocated": stat("allocated"), "max_memory_allocated": stat("peak"),
            "memory_reserved": stat("reserved"), "max_memory_reserved": stat("peak_reserved"),
            "memory_cached": stat("reserved"), "max_memory_cached": stat("peak_reserved"),
            "memory_stats": memory_stats, "memory_summary": summary, "reset_peak_memory_stats": reset_peak,
            "reset_max_memory_allocated": reset_peak, "reset_max_memory_cached": reset_peak,
            "reset_accumulated_memory_stats": lambda device=None: None, "empty_cache": empty_cache,
            "mem_get_info": lambda device=None: mem_get_info(state, device),
            "set_per_process_memory_fraction": lambda fraction, device=None: None}
