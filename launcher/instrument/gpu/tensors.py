"""Tensors and modules asked for the simulated GPU live on the CPU: cuda -> cpu at each door.

    python -c "from simcluster.launcher.instrument.gpu.tensors import to_cpu; print(to_cpu('cuda:0'), to_cpu('meta'))"

The doors come from torch's own signatures, not a hand list (``device_doors``): every aten
operator whose schema takes a ``device`` argument (``torch._C._jit_get_all_schemas()``) and is
public in ``torch``, ``torch.fft``, ``torch.special`` or ``torch.linalg``, every ``Tensor.new_*``
method, and the Python-level constructors torch's own ``with torch.device(...)`` handles
(``torch.utils._device._device_constructors``: ``asarray``, ``nested_tensor``). Each is a
Python-level wrapper of torch's own function (every thread sees it, torch's kernels run unchanged)
given ``device=``, registered with TorchScript as the aten operator it wraps, so scripted code that
calls ``torch.zeros`` compiles (``torch.jit._builtins``). Then the positional forms:
``Tensor.to`` (its arguments) and ``Module.to`` (through ``torch._C._nn._parse_to``), each given an
int, a string or a torch.device, positional or by keyword, so ``model.to(local_rank)`` works; ``Tensor.cuda``, ``Tensor.pin_memory`` (the tensor
itself), ``Tensor.record_stream``, ``torch.Generator(device=...)``; ``torch.set_default_device`` and
``with torch.device("cuda")`` (``DeviceContext``); ``torch.load``'s ``map_location`` (and a
checkpoint saved on GPUs, loaded without one); ``torch.autocast``/``torch.amp.autocast("cuda", dtype)``
(CPU autocast with that dtype); ``torch.amp.GradScaler("cuda")`` (torch's CPU GradScaler). A device
index beyond the visible GPUs raises torch's invalid-ordinal CUDA error (gpu/state.py). Tensors report
``device(type='cpu')``: code that tests ``x.is_cuda`` sees False.
"""
from __future__ import annotations

import functools

from simcluster.launcher.instrument.gpu.state import STATE



def to_cpu(d):
    """``d`` with a cuda device (str, torch.device, or an int: a cuda index, as torch reads one) made
    cpu (its index checked); anything else as is."""
    import torch
    if (isinstance(d, str) and d.startswith("cuda") or isinstance(d, torch.device) and d.type == "cuda"
            or type(d) is int):
        STATE.used = STATE.index(d)
        return torch.device("cpu")
    return d


def _kw(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = to_cpu(kwargs["device"])
        return fn(*args, **kwargs)
    wrapper.__simulated__ = fn
    return wrapper


def _kw_random(fn):
    """``_kw`` for a random factory: a device other than the current one draws from its own generator
    (gpu/bindings.py ``own_generator``), unless the call names a generator."""
    from simcluster.launcher.instrument.gpu.bindings import own_generator

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            given = kwargs["device"]
            kwargs["device"] = to_cpu(given)
            if kwargs["device"] is not given and STATE.used != STATE.current and kwargs.get("generator") is None:
                kwargs["generator"] = own_generator(STATE.used)
        return fn(*args, **kwargs)
    wrapper.__simulated__ = fn
    return wrapper


def _wrap(owner, name, make) -> None:
    fn = getattr(owner, name, None)
    if fn is not None and not hasattr(fn, "__simulated__"):
        new = make(fn)
        new.__simulated__ = fn
        setattr(owner, name, new)


NAMESPACES = {"": "", "fft": "fft_", "special": "special_", "linalg": "linalg_"}  # torch.X: aten's prefix


def random_ops(torch) -> set[str]:
    """The aten operators that take both a ``device`` and a ``generator`` (the random factories)."""
    return {s.name[6:] for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")
            and {"device", "generator"} <= {a.name for a in s.arguments}}


def device_doors(torch) -> list[tuple[object, str]]:
    """(owner, name) of every public function torch gives a ``device`` argument (see the module's
    docstring), from the operator schemas of this torch."""
    from torch.utils._device import _device_constructors

    ops = {s.name[6:] for s in torch._C._jit_get_all_schemas()
           if s.name.startswith("aten::") and any(a.name == "device" for a in s.arguments)}
    doors = []
    for op in sorted(ops):
        for ns, prefix in NAMESPACES.items():
            name = op[len(prefix):] if op.startswith(prefix) else None
            owner = getattr(torch, ns) if ns else torch
            if name and not name.startswith("_") and callable(getattr(owner, name, None)) \
                    and not isinstance(getattr(owner, name), type):
                doors.append((owner, name))
    doors += [(torch.Tensor, name) for name in dir(torch.Tensor) if name.startswith("new_")]  # each takes device=
    for fn in _device_constructors():
        for owner in (torch, torch.fft, torch.sparse, torch.nested):
            if getattr(owner, fn.__name__, None) is fn and (owner, fn.__name__) not in doors:
                doors.append((owner, fn.__name__))
    return doors


def install_factories(torch) -> None:
    """Wrap every door of ``device_doors``, each registered with TorchScript as its aten operator."""
    from torch.jit._builtins import _find_builtin, _register_builtin

    randoms = random_ops(torch)
    for owner, name in device_doors(torch):
        fn = getattr(owner, name)
        op = _find_builtin(fn)
        _wrap(owner, name, _kw_random if owner is torch and name in randoms else _kw)
        if op is not None:
            _register_builtin(getattr(owner, name), op)


def _device_args(args, kwargs):
    """``to``'s arguments with a cuda device (positional first, or ``device=``) made cpu."""
    import torch
    if args and (isinstance(args[0], (str, torch.device)) or type(args[0]) is int):
        args = (to_cpu(args[0]), *args[1:])
    if "device" in kwargs:
        kwargs["device"] = to_cpu(kwargs["device"])
    return args, kwargs


def install_moves(torch) -> None:
    """``Tensor.to``/``Module.to`` (``_parse_to``), ``Tensor.cuda``, pinning, ``record_stream``."""
    def to(fn):
        def wrapper(*args, **kwargs):
            self, (args, kwargs) = args[0], _device_args(args[1:], kwargs)
            return fn(self, *args, **kwargs)
        return wrapper
    _wrap(torch.Tensor, "to", to)
    def parse_to(fn):  # Module.to's parser
        def wrapper(*args, **kwargs):
            args, kwargs = _device_args(args, kwargs)
            return fn(*args, **kwargs)
        return wrapper
    _wrap(torch._C._nn, "_parse_to", parse_to)

    def cuda(fn):
        def wrapper(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
            STATE.index(device)
            return self.to("cpu", non_blocking=non_blocking, memory_format=memory_format)
        return wrapper
    _wrap(torch.Tensor, "cuda", cuda)
    _wrap(torch.Tensor, "pin_memory", lambda fn: lambda self, device=None: self)
    _wrap(torch.Tensor, "record_stream", lambda fn: lambda self, stream: None)
    _wrap(torch.Tensor, "is_pinned", lambda fn: lambda self, device=None: False)
    if not hasattr(torch.Generator, "__simulated__"):
        class Generator(torch.Generator):
            """``torch.Generator(device="cuda")``: a CPU generator (the simulated device's tensors are CPU tensors)."""
            __simulated__ = torch.Generator

            def __new__(cls, device="cpu"):
                return super().__new__(cls, to_cpu(device))
        torch.Generator = Generator


def install_contexts(torch) -> None:
    """The default device (``set_default_device``, ``with torch.device``) and ``torch.load``."""
    import torch.utils._device as devmod
    _wrap(devmod.DeviceContext, "__init__", lambda fn: lambda self, device: fn(self, to_cpu(device)))
    _wrap(torch, "set_default_device", lambda fn: lambda device: fn(to_cpu(device)))

    def load(fn):
        def wrapper(f, map_location=None, *args, **kwargs):
            if map_location is None:
                map_location = "cpu"
            elif isinstance(map_location, dict):
                map_location = {k: str(to_cpu(v)) if isinstance(v, str) else to_cpu(v) for k, v in map_location.items()}
            elif not callable(map_location):
                map_location = to_cpu(map_location)
            return fn(f, map_location, *args, **kwargs)
        return wrapper
    _wrap(torch, "load", load)


def install_amp(torch) -> None:
    """``autocast("cuda", dtype)`` -> CPU autocast with that dtype; ``GradScaler("cuda")`` -> CPU's."""
    from torch.amp import autocast_mode, grad_scaler

    def autocast_init(fn):
        def wrapper(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type, dtype = "cpu", dtype or torch.float16  # CUDA autocast's default dtype
            return fn(self, device_type, dtype, enabled, cache_enabled)
        return wrapper
    _wrap(autocast_mode.autocast, "__init__", autocast_init)

    def scaler_init(fn):
        def wrapper(self, device="cuda", *args, **kwargs):
            return fn(self, "cpu" if device == "cuda" else device, *args, **kwargs)
        return wrapper
    _wrap(grad_scaler.GradScaler, "__init__", scaler_init)


def install_tensors(torch) -> None:
    """Install every door above (idempotent)."""
    install_factories(torch)
    install_moves(torch)
    install_contexts(torch)
    install_amp(torch)
