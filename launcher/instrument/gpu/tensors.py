"""Tensors and modules asked for the simulated GPU live on the CPU: cuda -> cpu at each door.

    python -c "from simcluster.launcher.instrument.gpu.tensors import to_cpu; print(to_cpu('cuda:0'), to_cpu('meta'))"

The doors (each a Python-level wrapper of torch's own function, so every thread sees it and
torch's kernels run unchanged): the factories torch's ``with torch.device(...)`` handles
(``torch.utils._device._device_constructors``: zeros, empty, randn, arange, tensor, ...) and the
``*_like`` ones, given ``device=``; ``Tensor.to`` (a device positional or by keyword, an int
index), ``Tensor.cuda``, ``Tensor.new_*``, ``Tensor.pin_memory`` (the tensor itself),
``Tensor.record_stream``; ``torch.set_default_device`` and ``with torch.device("cuda")``
(``DeviceContext``); ``torch.load``'s ``map_location`` (and a checkpoint saved on GPUs, loaded
without one); ``torch.autocast``/``torch.amp.autocast("cuda", dtype)`` (CPU autocast with that
dtype); ``torch.amp.GradScaler("cuda")`` (torch's CPU GradScaler). A device index beyond the
node's GPUs raises torch's invalid-ordinal CUDA error (gpu/device.py). Tensors report
``device(type='cpu')``: code that tests ``x.is_cuda`` sees False.
"""
from __future__ import annotations

import functools

from simcluster.launcher.instrument.gpu.state import STATE

LIKE = ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like")
NEW = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided")


def to_cpu(d):
    """``d`` with a cuda device (str, torch.device, or an int: a cuda index, as torch reads one) made
    cpu (its index checked); anything else as is."""
    import torch
    if (isinstance(d, str) and d.startswith("cuda") or isinstance(d, torch.device) and d.type == "cuda"
            or type(d) is int):
        STATE.index(d)
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


def _wrap(owner, name, make) -> None:
    fn = getattr(owner, name, None)
    if fn is not None and not hasattr(fn, "__simulated__"):
        new = make(fn)
        new.__simulated__ = fn
        setattr(owner, name, new)


def install_tensors(torch) -> None:
    """Install every door above (idempotent)."""
    from torch.utils._device import _device_constructors

    for fn in _device_constructors():
        for owner in (torch, torch.fft, torch.sparse):
            if getattr(owner, fn.__name__, None) is fn:
                _wrap(owner, fn.__name__, _kw)
    for name in LIKE:
        _wrap(torch, name, _kw)
    for name in NEW:
        _wrap(torch.Tensor, name, _kw)

    def to(fn):
        def wrapper(self, *args, **kwargs):
            if args and (isinstance(args[0], (str, torch.device)) or type(args[0]) is int):
                a0 = args[0]
                args = (to_cpu(torch.device("cuda", a0) if type(a0) is int else a0), *args[1:])
            if "device" in kwargs:
                kwargs["device"] = to_cpu(kwargs["device"])
            return fn(self, *args, **kwargs)
        return wrapper
    _wrap(torch.Tensor, "to", to)

    def cuda(fn):
        def wrapper(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
            STATE.index(device)
            return self.to("cpu", non_blocking=non_blocking, memory_format=memory_format)
        return wrapper
    _wrap(torch.Tensor, "cuda", cuda)
    _wrap(torch.Tensor, "pin_memory", lambda fn: lambda self, device=None: self)
    _wrap(torch.Tensor, "record_stream", lambda fn: lambda self, stream: None)
    _wrap(torch.Tensor, "is_pinned", lambda fn: lambda self, device=None: False)

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
