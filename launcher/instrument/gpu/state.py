"""This rank's simulated devices: how many, which is current, the model, the current streams (one
shared state of the gpu/ modules).

    python -c "from simcluster.launcher.instrument.gpu.state import STATE; print(STATE.index('cuda:0'))"
"""
from __future__ import annotations

from dataclasses import dataclass, field

INVALID_ORDINAL = ("CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?\n"
                   "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                   "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


@dataclass
class State:
    """This rank's simulated devices: how many, which is current, the model, current streams."""

    count: int = 1
    current: int = 0
    model: object = None  # the GpuModel (gpu/device.py) once installed
    streams: dict = field(default_factory=dict)
    default_streams: dict = field(default_factory=dict)
    listeners: list = field(default_factory=list)  # f(index) called when the current device changes (gpu/memory.py)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name == "current":
            for f in getattr(self, "listeners", ()):
                f(value)

    def index(self, device=None, optional: bool = True) -> int:
        """The local index ``device`` names (None, int, "cuda", "cuda:N", torch.device); torch's
        invalid-ordinal CUDA error beyond the node's devices."""
        if device is None or device == "cuda":
            return self.current
        if isinstance(device, int):
            i = device
        else:
            import torch
            d = torch.device(device)
            if d.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {d}")
            i = self.current if d.index is None else d.index
        if not 0 <= i < self.count:
            import torch
            raise torch.AcceleratorError(INVALID_ORDINAL)
        return i


STATE = State()
