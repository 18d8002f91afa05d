"""--check-devices: a CPU tensor mixed with a cuda tensor in one op, and an nccl collective on a CPU
tensor, fail as on a GPU (off by default: it costs per op, BENCHMARKS.md "--check-devices").

    python -m pytest -q -n 0 tests/test_gpu_mistakes.py   # each GPU-only mistake, with the check and without

Every tensor of the simulated GPU is a CPU tensor, so which one a GPU would hold on the device is a
mark: each storage's block in the compiled allocator (gpu/counting_allocator.cpp) carries the device
it was made for, set from the calling thread's mark at its allocation and gone with the block (no
table of Python objects to keep in step, views share their base's mark, ``param.data = ...`` takes
the new block's). The marks: **cuda** (a factory given a cuda device, or none under
``set_default_device("cuda")``; ``.to(cuda)``, ``.cuda()``, ``Module.to/cuda``: copied, as a GPU copies
to the device, when the source is not cuda already), **cpu** (a factory given no device, or the
string ``"cpu"``; ``.cpu()`` and ``.to("cpu")`` of a cuda tensor: copied), **unknown** (a device
given as a ``torch.device("cpu")`` object, since that is what ``x.device`` answers for a cuda
tensor here, so ``torch.zeros(n, device=x.device)`` and ``batch.to(model_param.device)`` are never
refused; tensors from numpy, shared memory, other threads, or made before the check started).
One ``TorchDispatchMode`` looks at each op's plain tensor arguments: a cuda and a cpu tensor (not a
0-dim scalar, which CUDA takes) raise CUDA's ``RuntimeError: Expected all tensors to be on the same
device, but found at least two devices, cuda:N and cpu!`` (the first tensor's device named first, as
TensorIterator does), except in ops a GPU lets cross devices (copies, indexing with CPU indices);
what the op allocates gets its inputs' mark (cuda over cpu; unknown where an input is unknown
and none is known; a factory its door's, unknown when torch's C++ calls it: autograd's zeros).
An unknown tensor never raises: the check refuses only what a GPU would refuse. In a group the
program asked to be ``nccl`` (not ``cpu:gloo,cuda:nccl``), a collective or send/recv on a cpu-marked
tensor raises NCCL's ``ValueError: Tensors must be CUDA and dense``. Needs the compiled allocator.
"""
from __future__ import annotations

import functools
import threading
import weakref

from simcluster.launcher.instrument.gpu.script import refusal
from simcluster.launcher.instrument.gpu.state import STATE

UNKNOWN, CPU, CUDA = 0, 1, 2
MIXED = "Expected all tensors to be on the same device, but found at least two devices, {} and {}!"
NCCL_CPU = "Tensors must be CUDA and dense"  # ProcessGroupNCCL.cpp check_gpu_single_tensor (a ValueError)
CROSSING = ("copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "index.Tensor", "index_put_",
            "index_put", "_index_put_impl_", "set_", "lift_fresh", "lift_fresh_copy", "detach", "alias",
            "_local_scalar_dense", "_has_compatible_shallow_copy_type")  # ops a GPU runs across devices
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "reduce_scatter", "reduce", "all_to_all_single", "all_to_all", "send", "recv", "isend", "irecv",
               "gather", "scatter")
_DOOR = threading.local()  # .mark: what a factory door asks for while it runs in this thread (None: the inputs')
_NCCL_GROUPS: "weakref.WeakSet" = weakref.WeakSet()  # process groups the program asked to be nccl
_ACTIVE: list = []  # the mode and the counter once installed


def _name(d) -> str:
    return f"cuda:{STATE.current}" if d == CUDA else "cpu"


def mark_of(counter, t) -> int:
    """The mark of plain tensor ``t``'s storage (UNKNOWN for meta, sparse and empty storages)."""
    if not t.is_cpu:
        return UNKNOWN
    try:
        return counter.device_of(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage: sparse, nested, ...
        return UNKNOWN


def _tensors(args, kwargs, plain):
    for group in (args, kwargs.values()):
        for a in group:
            if type(a) in plain:
                yield a
            elif type(a) in (list, tuple):
                yield from (b for b in a if type(b) in plain)


def make_mode(torch, counter):
    """The check's dispatch mode over ``counter`` (gpu/native.py's NativeCounter)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    plain = (torch.Tensor, torch.nn.Parameter)
    crossing = {getattr(getattr(torch.ops.aten, n.split(".")[0]), n.split(".")[1] if "." in n else "default", None)
                for n in CROSSING if hasattr(torch.ops.aten, n.split(".")[0])}
    making = counter.set_making

    class DeviceCheck(TorchDispatchMode):
        """CUDA's mixed-device error where a cuda and a non-scalar cpu tensor meet; outputs marked."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            first = mark = UNKNOWN
            unknown = scalar_cpu = False
            for t in _tensors(args, kwargs, plain):
                d = mark_of(counter, t)
                if d == UNKNOWN:
                    unknown = True
                elif d == CPU and t.dim() == 0:
                    scalar_cpu = True
                elif first == UNKNOWN:
                    first = mark = d
                elif d != first and func not in crossing:
                    raise refusal(MIXED.format(_name(first), _name(d)))
                else:
                    mark = max(mark, d)
            door = getattr(_DOOR, "mark", None)
            if door is not None:
                mark = door
            elif mark == UNKNOWN and scalar_cpu and not unknown:
                mark = CPU
            making(mark)
            try:
                return func(*args, **kwargs)
            finally:
                making(UNKNOWN)

    return DeviceCheck()


def _door_mark(device, torch) -> int:
    """The mark a factory's ``device`` argument asks for (see the module's docstring)."""
    if device is None:  # the default device: a DeviceContext at the bottom of the torch function modes
        from torch.utils._device import DeviceContext
        bottom = torch._C._get_function_stack_at(0) if torch._C._len_torch_function_stack() else None
        return CUDA if isinstance(bottom, DeviceContext) and getattr(bottom, "_sim_cuda", False) else CPU
    if isinstance(device, str):
        return CPU if device == "cpu" else CUDA if device.startswith("cuda") else UNKNOWN
    if type(device) is int or isinstance(device, torch.device) and device.type == "cuda":
        return CUDA
    return UNKNOWN


def _with_door(fn, mark_of_call):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        prev, _DOOR.mark = getattr(_DOOR, "mark", None), mark_of_call(args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            _DOOR.mark = prev
    wrapper.__simulated__ = fn
    wrapper.__devcheck__ = True
    return wrapper


def _factory_mark(torch):
    def mark(args, kwargs):
        if "device" in kwargs:
            return _door_mark(kwargs["device"], torch)
        if any(isinstance(a, torch.Tensor) for a in args):
            return None  # *_like, new_*: the input's device
        return _door_mark(None, torch)
    return mark


def _move_target(torch, counter, args, kwargs):
    """The mark ``Tensor.to(*args, **kwargs)`` moves to (None: no device named)."""
    moving = getattr(_MOVE, "mark", None)
    if moving is not None:
        return moving
    d = kwargs.get("device", args[0] if args else None)
    if isinstance(d, torch.Tensor):
        return mark_of(counter, d)
    if d is None or isinstance(d, torch.dtype):
        return None
    return _door_mark(d, torch)


_MOVE = threading.local()  # .mark: what a Module.to/.cuda asks its tensors' .to for while it runs here


def install_moves(torch, counter) -> None:
    """``Tensor.to``/``.cuda``/``.cpu`` and ``Module.to``: a move to another mark copies under it."""
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def to(fn):
        def wrapper(self, *args, **kwargs):
            target = _move_target(torch, counter, args, kwargs)
            src = mark_of(counter, self) if target is not None else None
            if target is None or src == target or target == UNKNOWN and src != CPU or len(args) > 3:
                return fn(self, *args, **kwargs)
            prev, _DOOR.mark = getattr(_DOOR, "mark", None), target
            try:
                return fn(self, *args, **{**kwargs, "copy": True})
            finally:
                _DOOR.mark = prev
        return wrapper

    def moving(mark):
        def make(fn):
            def wrapper(*args, **kwargs):
                prev, _MOVE.mark = getattr(_MOVE, "mark", None), mark(args, kwargs)
                try:
                    return fn(*args, **kwargs)
                finally:
                    _MOVE.mark = prev
            return wrapper
        return make

    def module_mark(args, kwargs):
        return _move_target(torch, counter, args[1:], kwargs)

    cpu_fn = torch.Tensor.cpu
    _unwrapped(torch.Tensor, "to", to)
    _unwrapped(torch.Tensor, "cuda", moving(lambda a, k: CUDA))
    _unwrapped(torch.nn.Module, "to", moving(module_mark))
    _unwrapped(torch.nn.Module, "cuda", moving(lambda a, k: CUDA))
    torch.Tensor.cpu = functools.wraps(cpu_fn)(
        lambda self, memory_format=torch.preserve_format: self.to("cpu", memory_format=memory_format)
        if mark_of(counter, self) == CUDA else cpu_fn(self, memory_format=memory_format))


def _unwrapped(owner, name, make) -> None:
    """``owner.name`` wrapped by ``make`` on top of what is there (the simulation's own wrapper)."""
    fn = getattr(owner, name)
    new = make(fn)
    functools.update_wrapper(new, fn)
    new.__devcheck__ = True
    setattr(owner, name, new)


def install_defaults(torch) -> None:
    """``set_default_device("cuda")`` and ``with torch.device("cuda")``: factories given no device are cuda."""
    import torch.utils._device as devmod
    set_default = torch.set_default_device

    def set_default_device(device):  # torch's makes a DeviceContext of the device mapped to cpu: told here
        _MOVE.mark = CUDA if device is not None and _door_mark(device, torch) == CUDA else None
        try:
            return set_default(device)
        finally:
            _MOVE.mark = None
    torch.set_default_device = functools.wraps(set_default)(set_default_device)
    init = devmod.DeviceContext.__init__

    def ctx_init(self, device):  # C++ pushes a ``with torch.device(...)``'s context without __enter__
        self._sim_cuda = getattr(_MOVE, "mark", None) == CUDA or _door_mark(device, torch) == CUDA
        init(self, device)
    devmod.DeviceContext.__init__ = ctx_init


def install_collectives(torch, counter) -> None:
    """NCCL's refusal of a cpu-marked tensor in a group the program asked to be nccl."""
    import inspect

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def init_pg(fn):
        def wrapper(backend=None, *args, **kwargs):
            STATE.nccl_only = str(backend or "").lower() == "nccl"
            return fn(backend, *args, **kwargs)
        return wrapper

    def new_group(fn):
        sig = inspect.signature(fn.__simulated__ if hasattr(fn, "__simulated__") else fn)

        def wrapper(*args, **kwargs):
            group = fn(*args, **kwargs)
            backend = sig.bind_partial(*args, **kwargs).arguments.get("backend")
            if (str(backend).lower() == "nccl" if backend else STATE.nccl_only) and group is not None:
                _NCCL_GROUPS.add(group)
            return group
        return wrapper

    def collective(fn):
        sig = inspect.signature(getattr(fn, "__simulated__", fn))

        def wrapper(*args, **kwargs):
            group = sig.bind_partial(*args, **kwargs).arguments.get("group")
            if (STATE.nccl_only if group is None or group is c10d.GroupMember.WORLD else group in _NCCL_GROUPS) \
                    and any(mark_of(counter, t) == CPU for t in _tensors(args, kwargs, (torch.Tensor,))):
                raise ValueError(NCCL_CPU)
            return fn(*args, **kwargs)
        return wrapper

    for mod in (dist, c10d):
        _unwrapped(mod, "init_process_group", init_pg)
        _unwrapped(mod, "new_group", new_group)
        for name in COLLECTIVES:
            if hasattr(mod, name):
                _unwrapped(mod, name, collective)


def install(torch, counter) -> None:
    """Start the check in this rank (once): the doors marked, the mode entered, the collectives checked."""
    from simcluster.launcher.instrument.gpu.tensors import device_doors
    from simcluster.launcher.instrument.lazy import when_imported
    from torch.jit._builtins import _find_builtin, _register_builtin

    if _ACTIVE:
        return
    mark = _factory_mark(torch)
    for owner, name in device_doors(torch):
        fn = getattr(owner, name)
        if not getattr(fn, "__devcheck__", False):
            op = _find_builtin(fn)
            setattr(owner, name, _with_door(fn, mark))
            if op is not None:  # TorchScript still compiles a call to it as the aten operator
                _register_builtin(getattr(owner, name), op)
    install_moves(torch, counter)
    install_defaults(torch)
    when_imported("torch.distributed.distributed_c10d", lambda _m: install_collectives(torch, counter))
    mode = make_mode(torch, counter)
    mode.__enter__()
    _ACTIVE.extend((mode, counter))
