"""The recorder of a full-size run: every allocation and free of the device's tensors, in order, each
op's FLOPs and bytes, each collective's kind, bytes and group, and the phase they happened in.

    python -m pytest -q -n 0 tests/test_fullsize.py -k tiny_run

A TorchDispatchMode entered above torch's FakeTensorMode (so it sees every op first): an op's outputs
whose untyped storage is new are allocations (a weak reference's callback, when the storage object
dies, is the free); ``UntypedStorage.resize_`` is wrapped (FSDP2 frees and re-makes its unsharded
parameters by resizing their storage, which no dispatch mode sees), as torch's own
torch/distributed/_tools/mem_tracker.py does. An op with a DTensor argument is left to DTensor's
dispatch (the mode returns NotImplemented), whose local ops then come back here: the temporaries of
DTensor's handlers and the collectives of its redistributions are recorded, except the ops of its
sharding propagation (global-shape fakes, no device memory: wrapped while recording). FLOPs come from train/plan/flops.py
(torch.utils.flop_counter's formulas; CPU flash attention by the CUDA kernel's, a causal mask halving it);
bytes of an op are its tensors' bytes in and out (a DTensor's: its local tensor's). A ``.item()`` (aten._local_scalar_dense) on a fake
tensor, which FakeTensorMode cannot answer, is answered 1 (a flag False) here, ``torch.allclose`` and
``torch.equal`` True (a check that passes), and its line in the program recorded.
The phase is torch's ModTracker's deepest module, forward or backward, and the microbatch (the n-th
forward of the outermost module since the last optimizer step), and the step (optimizer steps, counted
by torch's global optimizer step hook); outside every module, the module phase it comes after (the
loss after the output layer's forward, the optimizer after the first layer's backward).
"""
from __future__ import annotations

import sys
import traceback
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.distributed._tools.fake_collectives import CollectiveOp, collective_ops
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_map

from simcluster.train.plan.flops import op_flops
from simcluster.train.plan.fullsize.trace import NOT_THE_PROGRAM

from simcluster.train.plan.fullsize import ring

aten = torch.ops.aten
_SKIP_BYTES = {aten.view, aten._unsafe_view, aten.t, aten.transpose, aten.expand, aten.permute, aten.slice,
               aten.select, aten.as_strided, aten.detach, aten.alias, aten.unsqueeze, aten.squeeze, aten.split,
               aten.split_with_sizes, aten.chunk, aten.unbind, aten.empty, aten.empty_strided, aten.new_empty,
               aten.new_empty_strided, aten.lift_fresh, aten.reshape}


_TORCH_NAMESPACES = {"aten", "prim", "prims", "c10d", "_c10d_functional", "_c10d_functional_autograd", "fsdp",
                     "_dtensor", "higher_order", "profiler"}


# ops whose Python answer is read from tensor values: answered True (a check that passes) and listed
_ANSWERED_TRUE = (aten.allclose.default, aten.equal.default)


class Recorder(TorchDispatchMode):
    """Records, in ``self.events`` (a list of tuples, in program order):
    ``("a", sid, bytes, phase, stream)`` an allocation on a stream (0: the default), ``("f", sid, phase)``
    a free, ``("r", sid, bytes, phase, stream)`` a storage resized to bytes (0: freed), ``("op", flops, bytes, phase, fp32, name)`` a compute op (flops
    already halved for a causal attention; fp32 1 when its first input is float32; name the aten op's), ``("c", kind, bytes,
    group_size, group_ranks, phase, sids)`` a collective (kind the op's name, context parallel's ring's own: ring.py; sids: the storages of its input and output tensors), ``("tok", n, phase)`` an embedding lookup of n
    indices in a forward (the tokens of a microbatch).
    ``self.phases`` is the list of phase names the events index; ``self.placeholders`` the program lines
    whose ``.item()`` got a placeholder (1, False for a flag). ``self.steps`` counts optimizer steps."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple] = []
        self.phases: list[str] = []
        self._phase_index: dict[str, int] = {}
        self._ids: dict[int, int] = {}  # id(storage) -> sid while alive
        self._next = 0
        self.placeholders: dict[str, int] = {}
        self.custom: set[str] = set()
        self._streams: list = [torch.cpu.current_stream()]  # index 0: the default stream
        self.steps = 0
        self.microbatch = 0
        self._last = ""  # the last module phase seen: where an "outside the model" phase comes after
        self.tracker = ModTracker()
        self._orig_resize = None
        self._hook = None
        self._quiet = 0  # > 0 inside DTensor's sharding propagation
        self._orig_meta = None
        self.ring = 0  # > 0 inside context parallel's ring attention (ring.py names its collectives)
        self._unwrap_ring = None
        self.sizes: dict[int, int] = {}  # sid -> bytes of each storage alive: what torch.cuda.memory_stats reports
        self.allocated = self.peak = self.total_allocated = self.total_freed = self.total_count = 0

    # -- phases
    def phase(self) -> int:
        """The index of the current phase name in self.phases."""
        parents = self.tracker.parents
        deepest = max(parents, key=lambda p: (p.count(".") + (p != "Global"), len(p))) if parents else "Global"
        if deepest == "Global":
            after = f", after the {self._last}" if self._last else ""
            name = f"step {self.steps + 1}, outside the model{after}"
        else:
            way = "backward" if self.tracker.is_bw else "forward"
            self._last = f"{way} of {deepest}"
            name = f"step {self.steps + 1}, microbatch {max(self.microbatch, 1)}, {way} {deepest}"
        i = self._phase_index.get(name)
        if i is None:
            i = self._phase_index[name] = len(self.phases)
            self.phases.append(name)
        return i

    def _root_pre_hook(self, module, args):
        if not self.tracker.is_bw and self.tracker.parents <= {"Global"}:
            self.microbatch += 1

    def _step_hook(self, optimizer, args, kwargs):
        if self.microbatch:  # an optimizer inside another's step (a container's) counts once
            self.steps += 1
        self.microbatch = 0

    def _stream(self) -> int:
        """The index of the current stream (torch.cpu's: the simulated GPU's tensors are CPU tensors, and
        FSDP selects its all-gather and reduce-scatter streams through torch.cpu.stream); 0 the default."""
        s = torch.cpu.current_stream()
        for i, known in enumerate(self._streams):
            if known is s:
                return i
        self._streams.append(s)
        return len(self._streams) - 1

    # -- storages
    def _track(self, t: torch.Tensor, ph: int) -> None:
        if t.device.type == "meta":  # no device memory (a model built on the meta device)
            return
        if is_traceable_wrapper_subclass(t):  # a DTensor: its local tensors' storages
            for name in t.__tensor_flatten__()[0]:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    self._track(inner, ph)
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self._ids:
            return
        sid = self._next
        self._next += 1
        self._ids[key] = sid
        self.events.append(("a", sid, st.nbytes(), ph, self._stream()))
        self._size(sid, st.nbytes())
        self.total_count += 1

        def gone(_ref, key=key, sid=sid, events=self.events, ids=self._ids, rec=self):
            ids.pop(key, None)
            events.append(("f", sid, rec.phase()))
            rec._size(sid, 0)

        weakref.finalize(st, gone, None)

    def _size(self, sid: int, nbytes: int) -> None:
        """Storage ``sid`` now holds ``nbytes`` (0: freed): the running allocated, peak and totals."""
        before = self.sizes.pop(sid, 0)
        if nbytes:
            self.sizes[sid] = nbytes
        self.allocated += nbytes - before
        self.total_allocated += max(0, nbytes - before)
        self.total_freed += max(0, before - nbytes)
        self.peak = max(self.peak, self.allocated)

    def _wrap_resize(self) -> None:
        orig = self._orig_resize = torch.UntypedStorage.resize_
        rec = self

        def resize_(st, size):
            out = orig(st, size)
            sid = rec._ids.get(id(st))
            if sid is not None:
                rec.events.append(("r", sid, st.nbytes(), rec.phase(), rec._stream()))
                rec._size(sid, st.nbytes())
            return out

        torch.UntypedStorage.resize_ = resize_

    def _wrap_propagation(self) -> None:
        """DTensor's sharding propagation runs each new op on fake tensors of the global shape (torch's
        ShardingPropagator._propagate_tensor_meta_non_cached, private in torch 2.13) to learn its output's
        shape; the ops it runs come back to this mode and are not the rank's: recorded as nothing."""
        try:
            from torch.distributed.tensor._sharding_prop import ShardingPropagator
        except ImportError:
            return
        orig = self._orig_meta = ShardingPropagator._propagate_tensor_meta_non_cached
        rec = self

        def quiet(prop, op_schema):
            rec._quiet += 1
            try:
                return orig(prop, op_schema)
            finally:
                rec._quiet -= 1

        ShardingPropagator._propagate_tensor_meta_non_cached = quiet

    def __enter__(self):
        self._wrap_resize()
        self._wrap_propagation()
        self._unwrap_ring = ring.wrap(self)
        self._pre = torch.nn.modules.module.register_module_forward_pre_hook(self._root_pre_hook)
        self.tracker.__enter__()  # after the hook above: that one sees the parents before this one adds the module
        self._hook = register_optimizer_step_post_hook(self._step_hook)
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._hook.remove()
        self._pre.remove()
        self.tracker.__exit__(*exc)
        torch.UntypedStorage.resize_ = self._orig_resize
        self._unwrap_ring()
        if self._orig_meta is not None:
            from torch.distributed.tensor._sharding_prop import ShardingPropagator

            ShardingPropagator._propagate_tensor_meta_non_cached = self._orig_meta
        return out

    # -- ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            t = args[0]
            return self._answer(False if t.dtype == torch.bool else 1 if not t.is_floating_point() else 1.0)
        if func in _ANSWERED_TRUE:
            return self._answer(True)
        if any(is_traceable_wrapper_subclass(t) for t in tree_flatten((args, kwargs))[0]):
            return NotImplemented  # a DTensor's op: its own dispatch runs, and its local ops come back here
        if self._quiet:  # DTensor's sharding propagation: global-shape fakes, no device memory, no work
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        ph = self.phase()
        if func.namespace not in _TORCH_NAMESPACES:
            self.custom.add(f"{func.namespace}.{func.overloadpacket.__name__}")
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in flat_out:
            self._track(t, ph)
        if func in collective_ops:
            self._collective(func, out, args, kwargs, ph)
        else:
            self._op(func, out, args, kwargs, flat_out, ph)
        return out

    def _op(self, func, out, args, kwargs, flat_out, ph) -> None:
        packet = func.overloadpacket
        args, kwargs, out = tree_map(_local, (args, kwargs, out))  # a DTensor's op: its local shard's shapes
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        flops = op_flops(packet, args, kwargs, out)
        nbytes = 0
        if flat_out and not func.is_view and packet not in _SKIP_BYTES:
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            nbytes = sum(t.numel() * t.element_size() for t in (*ins, *flat_out))
        if flops or nbytes:
            first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), None)
            wide = int(first is not None and first.dtype == torch.float32)
            self.events.append(("op", int(flops), int(nbytes), ph, wide, packet.__name__))
        if packet is aten.embedding and not self.tracker.is_bw and len(args) > 1:
            self.events.append(("tok", int(args[1].numel()), ph))

    def _collective(self, func, out, args, kwargs, ph) -> None:
        if func is torch.ops._c10d_functional.wait_tensor.default:
            return
        name = func.overloadpacket.__name__.strip("_")
        try:
            pg = CollectiveOp.get_process_group(func, args)
            size, ranks = pg.size(), torch.distributed.get_process_group_ranks(pg)
        except Exception:  # a group torch's helper cannot resolve: the world
            size = torch.distributed.get_world_size()
            ranks = list(range(size))
        try:
            nbytes = CollectiveOp.get_comm_tensor_size(func, out, args, kwargs)
        except TypeError:
            nbytes = 0
        if self.ring:
            name, nbytes = ring.kind(name, args, nbytes)
        tensors = [_local(t) for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        sids = sorted({self._ids[id(t.untyped_storage())] for t in tensors if id(t.untyped_storage()) in self._ids})
        self.events.append(("c", name, int(nbytes), size, tuple(ranks), ph, tuple(sids)))

    def _answer(self, value):
        """``value`` in place of what a fake tensor cannot tell, the program's line counted in placeholders."""
        frame = _program_line()
        self.placeholders[frame] = self.placeholders.get(frame, 0) + 1
        return value


def _local(x):
    """A DTensor's local tensor (its FLOPs and bytes are the rank's), anything else as is."""
    return x._local_tensor if is_traceable_wrapper_subclass(x) and hasattr(x, "_local_tensor") else x


def _program_line() -> str:
    """file:line of the innermost frame outside torch and the full-size plan's own files (the program's line)."""
    for fs in reversed(traceback.extract_stack()):
        if not any(part in fs.filename for part in (*NOT_THE_PROGRAM, "<")):
            return f"{fs.filename}:{fs.lineno} ({fs.line})"
    return "unknown line"


def live_bytes(events: list[tuple]) -> int:
    """Bytes alive at the end of ``events`` (allocations minus frees, resizes applied)."""
    size: dict[int, int] = {}
    for e in events:
        if e[0] in ("a", "r"):
            size[e[1]] = e[2]
        elif e[0] == "f":
            size.pop(e[1], None)
    return sum(size.values())


if __name__ == "__main__":
    sys.exit("run by the full-size plan (launcher/instrument/fullsize.py); see the docstring")
