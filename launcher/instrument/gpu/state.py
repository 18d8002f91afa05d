"""This rank's simulated devices: how many (the node's GPUs, as the program's own CUDA_VISIBLE_DEVICES
shows them), which is current, the model, the current streams (one shared state of the gpu/ modules).

    python -c "from simcluster.launcher.instrument.gpu.state import STATE; print(STATE.index('cuda:0'))"

The node's GPUs are its ranks (torchrun's LOCAL_WORLD_SIZE). Which of them a process sees is read
once, at the first question, from ``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it at its
initialization (torch's own parser, ``torch.cuda._parse_visible_devices``: indices or ``GPU-`` UUIDs,
the list ends at the first invalid or out-of-range entry, a repeated entry leaves none), so a program
that sets it before its first CUDA call sees only those devices, numbered from 0.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

INVALID_ORDINAL = ("CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?\n"
                   "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                   "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def uuid(physical: int) -> str:
    """The simulated UUID of the node's GPU ``physical`` (as ``get_device_properties(i).uuid``)."""
    return f"00000000-0000-0000-0000-{physical:012d}"


def visible(physical: int) -> list[int]:
    """The node's GPU indices this process sees, in its order, given ``physical`` GPUs on the node
    and the environment's CUDA_VISIBLE_DEVICES (all of them when it is unset)."""
    import torch.cuda
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return list(range(physical))
    entries = torch.cuda._parse_visible_devices()
    if entries and isinstance(entries[0], str):
        entries = torch.cuda._transform_uuid_to_ordinals(entries, [f"GPU-{uuid(i)}" for i in range(physical)])
    out = []
    for i in entries:
        if i >= physical:
            break
        out.append(i)
    return out


@dataclass
class State:
    """This rank's simulated devices: the node's GPUs (``physical``), those visible (read at the first
    question), the current index, the model, current streams."""

    physical: int = 1
    current: int = 0
    model: object = None  # the GpuModel (gpu/device.py) once installed
    streams: dict = field(default_factory=dict)
    default_streams: dict = field(default_factory=dict)
    seen: list | None = None  # the visible GPUs' node indices, once read
    used: int | None = None  # the index the rank's tensors last named (cuda:N), for NCCL's device binding
    nccl: bool = False  # the program asked for an nccl process group
    nccl_only: bool = False  # --check-devices: the default group was asked as "nccl" alone (gpu/devcheck.py)

    @property
    def count(self) -> int:
        """The devices this process sees (``device_count``)."""
        if self.seen is None:
            self.seen = visible(self.physical)
        return len(self.seen)
    listeners: list = field(default_factory=list)  # f(index) called when the current device changes (gpu/memory.py)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name == "current":
            for f in getattr(self, "listeners", ()):
                f(value)

    def index(self, device=None, optional: bool = True) -> int:
        """The local index ``device`` names (None, int, "cuda", "cuda:N", torch.device); torch's
        invalid-ordinal CUDA error beyond the visible devices."""
        if device is None or device == "cuda":
            i = self.current
        elif isinstance(device, int):
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
