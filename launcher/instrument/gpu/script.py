"""TorchScript on the simulated GPU: the ``cuda::`` operators scripted code calls for ``torch.cuda``'s
functions, which only torch's CUDA builds register, answered by the simulated device.

    python -c "from simcluster.launcher.instrument.gpu.script import OPS; print([s for s, _ in OPS])"

TorchScript compiles ``torch.cuda.current_device()`` to the operator ``cuda::_current_device`` (and
``device_count``, ``set_device``, ``synchronize``, ``torch.cuda.device(i)``'s exchanges alike); a CPU
build has none, so scripted code calling them fails to compile ("Unknown builtin op"). Each is
defined here with torch.library and answered by torch.cuda's simulated function, so such code
compiles and runs. Scripted code that makes a tensor on ``cuda`` (``device="cuda"``, ``.cuda()``,
``.to("cuda")`` inside the scripted function) still fails: TorchScript hands the device to torch's
C++ operator, which the Python-level doors (gpu/tensors.py) never see.
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
