"""The simulated device's memory counted per op: the fallback where no compiled allocator loads.

    python -c "import torch; from simcluster.launcher.instrument.gpu.tracker import make_tracker; t = make_tracker(); t.__enter__(); x = torch.zeros(1000); t.__exit__(None, None, None); print(t.allocated, t.peak)"

gpu/memory.py counts with the compiled allocator (gpu/counting_allocator.cpp, gpu/native.py); where
none can be had (no g++ on a host, code mounted over an image of other source), with this
``TorchDispatchMode`` (``Tracker``), which sees the outputs of every aten op the rank runs in its
main thread: each output's storage (a wrapper subclass's, as DTensor's, through its inner tensors)
not seen before is counted, its size rounded up to CUDA's 512-byte block, and a
``weakref.finalize`` on the storage subtracts it when torch frees it. It costs per op (BENCHMARKS.md,
``python -m bench.gpu_memory``), misses tensors made in other threads and intermediates inside
``torch.compile``d code (the mode steps aside while torch compiles: ``ignore_compile_internals``),
and gives no out-of-memory verdict. The same attributes as gpu/native.py's ``NativeCounter``.
"""
from __future__ import annotations

import weakref

BLOCK = 512  # CUDA caching allocator's kMinBlockSize: every allocation rounds up to it


def _round(n: int) -> int:
    return -(-n // BLOCK) * BLOCK if n else 0


class Counts:
    """The statistics the fallback keeps (bytes rounded to BLOCK, counts of live storages, peaks), torch-free:
    ``add`` a storage first seen, ``free`` it once torch frees it."""

    def __init__(self):
        self.allocated = self.peak = self.reserved = self.peak_reserved = self.run_peak = 0
        self.total_allocated = self.total_freed = self.count = self.peak_count = self.total_count = 0
        self.num_ooms = 0
        self.seen: set[int] = set()

    def add(self, key: int, n: int) -> None:
        """A storage ``key`` of ``n`` bytes (rounded) made: counted, peaks raised."""
        self.seen.add(key)
        self.allocated += n
        self.total_allocated += n
        self.count += 1
        self.total_count += 1
        self.peak_count = max(self.peak_count, self.count)
        if self.allocated > self.peak:
            self.peak = self.allocated
            self.run_peak = max(self.run_peak, self.peak)
        if self.allocated > self.reserved:
            self.reserved = self.allocated
            self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, key: int, n: int) -> None:
        """The storage ``key`` of ``n`` bytes freed."""
        self.seen.discard(key)
        self.allocated -= n
        self.total_freed += n
        self.count -= 1

    def set(self, name: str, value: int) -> None:
        """Write one statistic (a peak reset, empty_cache)."""
        setattr(self, name, value)

    def set_limit(self, total: int, limit: int, fraction_set: bool) -> None:
        """No verdict here: this fallback counts, it does not refuse (the compiled allocator does)."""

    def set_device(self, index: int) -> None:
        """The fallback names no device."""


def make_tracker():
    """A new Tracker (its class needs torch, imported here)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_flatten

    class Tracker(Counts, TorchDispatchMode):
        """Counts the live storages of the tensors the rank's ops return (see the module's docstring)."""

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            """Off while torch.compile compiles, on while its compiled code runs: compile works."""
            return True

        def __init__(self):
            Counts.__init__(self)
            TorchDispatchMode.__init__(self)

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
            if s._cdata in self.seen:
                return
            n = _round(s.nbytes())
            self.add(s._cdata, n)
            weakref.finalize(s, self.free, s._cdata, n)

    return Tracker()
