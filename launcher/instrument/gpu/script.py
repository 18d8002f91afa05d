"""TorchScript on the simulated GPU: the ``cuda::`` operators scripted code calls for ``torch.cuda``'s
functions, which only torch's CUDA builds register, answered by the simulated device.

    python -c "from simcluster.launcher.instrument.gpu.script import OPS; print([s for s, _ in OPS])"

TorchScript compiles ``torch.cuda.current_device()`` to the operator ``cuda::_current_device`` (and
``device_count``, ``set_device``, ``synchronize``, ``torch.cuda.device(i)``'s exchanges alike); a CPU
build has none, so scripted code calling them fails to compile ("Unknown builtin op"). Each is
defined here with torch.library and answered by torch.cuda's simulated function, so such code
compiles and runs.

A tensor made on ``cuda`` inside scripted code (``torch.zeros(3, device="cuda")``,
``device=torch.device("cuda:1")``, any factory): TorchScript hands the device to torch's C++ operator,
which the Python-level doors (gpu/tensors.py) never see, and the dispatcher sends the call to the CUDA
key, where a CPU build has no kernel. ``install_script_factories`` registers one boxed fallback for that
key (``torch.library.Library("_", "IMPL").fallback``): the call's cuda devices made cpu (the index
checked, gpu/tensors.py ``to_cpu``), the operator called again. Only calls that reach the CUDA key run
it (eager code's devices are cpu before dispatch): no cost per op. Not handled: ``.to("cuda")`` and
``.cuda()`` inside scripted code (``aten::_to_copy``'s device guard refuses a cuda device in a CPU
build before any kernel runs); call them outside the scripted function.
"""
from __future__ import annotations

OPS = (  # (schema in the cuda namespace, the torch.cuda function that answers it)
    ("_current_device() -> int", "current_device"),
    ("device_count() -> int", "device_count"),
    ("_set_device(int device) -> ()", "set_device"),
    ("_exchange_device(int device) -> int", "_exchange_device"),
    ("_maybe_exchange_device(int device) -> int", "_maybe_exchange_device"),
    ("synchronize() -> ()", "synchronize"),
    ("synchronize.device(Device? device) -> ()", "synchronize"),
    ("synchronize.int(int? val) -> ()", "synchronize"),
)
_LIB: list = []  # the torch.library.Library, kept alive (its registrations last while it does)
_FALLBACK: list = []  # the CUDA key's fallback library, kept alive


def install_script_ops(torch) -> None:
    """Define and implement OPS once in this process (idempotent)."""
    if _LIB:
        return
    lib = torch.library.Library("cuda", "FRAGMENT")
    for schema, name in OPS:
        lib.define(schema)
        lib.impl(schema.split("(", 1)[0], _caller(torch, name), "CompositeExplicitAutograd")
    _LIB.append(lib)


def _caller(torch, name: str):
    def call(*args):
        return getattr(torch.cuda, name)(*args)
    return call


def _on_cpu(op, *args, **kwargs):
    """The CUDA key's fallback: ``op`` called again with its cuda devices made cpu."""
    from simcluster.launcher.instrument.gpu.tensors import to_cpu

    def cpu(a):
        return to_cpu(a) if type(a).__name__ == "device" else a
    return op(*(cpu(a) for a in args), **{k: cpu(v) for k, v in kwargs.items()})


def install_script_factories(torch) -> None:
    """Register ``_on_cpu`` as the CUDA dispatch key's fallback once in this process (idempotent)."""
    if _FALLBACK:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_on_cpu, "CUDA")
    _FALLBACK.append(lib)
