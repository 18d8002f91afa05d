"""What stays real in a full-size rank (launcher/instrument/fullsize.py), and the memory statistics its
program reads: the dispatch mode that runs ops on meta tensors alone, and in-place reshapes of host
data, outside torch's FakeTensorMode, and torch.cuda.memory_stats answered from the recorder's running counts.

    python -m pytest -q -n 0 tests/test_fullsize_cp.py -k context_parallel
"""
from __future__ import annotations


def real_mode(torch):
    """A dispatch mode above the fake mode: an op whose tensors are all real meta tensors, or a factory
    on the meta device, runs outside the fake mode. Meta tensors hold no data and no device memory, so
    nothing is lost; a module built on the meta device keeps torch's own parameters, and its
    ``to_empty`` takes torch's path for them (a FakeTensor on meta, weakly referenced by the fake
    mode, cannot be swapped for its materialized one: "Couldn't swap Embedding.weight").
    So does an op that changes a real tensor's shape in place (torch's ``inplace_view`` ops: ``resize_``,
    ``unsqueeze_``...), which the fake mode refuses: on a GPU, context parallel's ``context_parallel()``
    shards the program's batch in place, and the batch here is real host data (fullsize.py's
    _host_data_real and _loader_batches_real; ``.to("cuda")`` of it is no copy here). Every other op
    on real tensors meets the fake mode, which makes fakes of them (``allow_non_fake_inputs``)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_flatten

    class Real(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            real = all(not isinstance(t, FakeTensor) and not is_traceable_wrapper_subclass(t) for t in flat)
            meta = real and all(t.is_meta for t in flat) and (bool(flat) or str(kwargs.get("device", "")) == "meta")
            reshaped = real and bool(flat) and torch.Tag.inplace_view in func.tags
            if meta or reshaped:
                with _disable_current_modes():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    return Real()


class RecordedMemory:
    """torch.cuda's memory statistics in a full-size run (gpu/memory.py's COUNTER), from the Recorder's
    running count of the rank's storages, so that a program's own memory report (torchtitan's
    ``memory_stats()["active_bytes.all.peak"]``) reads what a GPU's allocator would give it. Reserved
    is reported as allocated: the caching allocator's figure comes from the replay after the run
    (train/plan/fullsize/memory.py). No verdict here: the replay gives it."""

    def __init__(self, rec):
        self._rec = rec

    allocated = property(lambda self: self._rec.allocated)
    reserved = allocated
    peak = property(lambda self: self._rec.peak)
    peak_reserved = peak
    count = peak_count = property(lambda self: len(self._rec.sizes))
    total_allocated = property(lambda self: self._rec.total_allocated)
    total_freed = property(lambda self: self._rec.total_freed)
    total_count = property(lambda self: self._rec.total_count)
    num_ooms = 0

    def set(self, name: str, value: int) -> None:
        """reset_peak_memory_stats and reset_accumulated_memory_stats: the peak and the totals."""
        target = {"peak_reserved": "peak", "num_ooms": None, "reserved": None, "count": None,
                  "peak_count": None}.get(name, name)
        if target:
            setattr(self._rec, target, value)

    def set_limit(self, *_args) -> None:
        """The capacity is the replay's (no out-of-memory verdict during the run)."""

    def set_device(self, *_args) -> None:
        """One device a rank."""
