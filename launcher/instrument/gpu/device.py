"""The simulated device's answers to ``torch.cuda`` and ``torch.accelerator`` above the bindings: a
node's ranks are its GPUs, each rank's tensors live on its CPU.

    python -c "from simcluster.launcher.instrument.gpu.device import GpuModel; print(GpuModel.named('h100-sxm'))"

``install_device`` answers the bindings torch's own ``torch.cuda`` functions call (gpu/bindings.py:
availability, count, current device, properties, RNG run as torch wrote them), and replaces, in
``torch.cuda`` and ``torch.accelerator``, the public functions whose torch body a CPU build cannot
run: ``torch.accelerator``'s (C++ device hooks), streams and events (gpu/streams.py: the CUDA stream
classes are placeholders in a CPU build), ``is_bf16_supported``/``is_tf32_supported`` (they read the
CUDA build's version), NVTX ranges (no-ops) and the memory statistics (gpu/memory.py). The device's
name, capability and memory come from the planner's hardware model (simcluster/core/hardware.py).
"""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

from simcluster.launcher.instrument.gpu.state import STATE, uuid
from simcluster.core.hardware import GPU_ALIASES, HARDWARE

DEFAULT_GPU = "h100-sxm"
@dataclass(frozen=True)
class GpuModel:
    """The GPU a rank simulates: name (as ``get_device_name``), total memory (bytes), compute
    capability, streaming multiprocessors, L2 cache (bytes); from the planner's hardware model."""

    key: str
    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    L2_cache_size: int

    @classmethod
    def named(cls, gpu: str) -> "GpuModel":
        """The model ``gpu`` names (``h100-sxm``, ``a100-80g`` or the planner's ``h100-sxm-8x``...).
        Raises KeyError for an unknown name (the launcher checks names before a rank starts)."""
        hw = HARDWARE[GPU_ALIASES.get(gpu, gpu)]
        return cls(gpu, hw.device_name, int(hw.memory), hw.capability[0], hw.capability[1], hw.sm_count, hw.l2_cache)


class DeviceProperties:
    """``torch.cuda.get_device_properties``: the attributes of torch's ``_CudaDeviceProperties``."""

    def __init__(self, model: GpuModel, index: int):
        self.name, self.total_memory = model.name, model.total_memory
        self.major, self.minor = model.major, model.minor
        self.multi_processor_count, self.L2_cache_size = model.multi_processor_count, model.L2_cache_size
        self.is_integrated, self.is_multi_gpu_board = False, False
        self.uuid = uuid(index)
        self.gcnArchName = "NVIDIA CUDA gcnArchName not available for simulated device"
        self.warp_size, self.max_threads_per_multi_processor = 32, 2048
        self.regs_per_multiprocessor, self.shared_memory_per_block = 65536, 49152

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count}, "
                f"uuid={self.uuid}, L2_cache_size={self.L2_cache_size // 2**20}MB)")


@contextlib.contextmanager
def _no_op_ctx(*_a, **_k):
    yield


def _stream(device=None):
    from simcluster.launcher.instrument.gpu.streams import Stream
    i = STATE.index(device)
    if i not in STATE.default_streams:
        STATE.default_streams[i] = Stream(i)
    return STATE.streams.get(i) or STATE.default_streams[i]


def _default_stream(device=None):
    _stream(device)
    return STATE.default_streams[STATE.index(device)]


def _bf16(including_emulation: bool = True) -> bool:
    return STATE.model.major >= 8 or including_emulation


def functions(torch) -> dict:
    """name -> the simulated function, for ``torch.cuda`` (its submodules get the same names): the
    public functions whose torch body cannot run on a CPU build (the rest is torch's own, over
    gpu/bindings.py)."""
    from simcluster.launcher.instrument.gpu import memory, streams
    cuda = {
        "is_bf16_supported": _bf16, "is_tf32_supported": lambda: STATE.model.major >= 8,
        "is_current_stream_capturing": lambda: False,
        "Stream": streams.Stream, "Event": streams.Event, "StreamContext": streams.StreamContext,
        "stream": streams.StreamContext, "current_stream": _stream, "default_stream": _default_stream,
        "set_stream": lambda s: STATE.streams.__setitem__(s.device_index, s),
    }
    cuda.update(memory.functions(STATE))
    return cuda


def accelerator_functions(torch) -> dict:
    """name -> the simulated function, for ``torch.accelerator`` (the same device, as CUDA's; its
    own body asks C++ device hooks a CPU build answers with the CPU)."""
    from simcluster.launcher.instrument.gpu import memory
    cuda = torch.cuda
    acc = {
        "is_available": lambda check_available=False: cuda.is_available(), "device_count": lambda: cuda.device_count(),
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: cuda.current_device(), "current_device_idx": lambda: cuda.current_device(),
        "set_device_index": lambda device: cuda.set_device(device), "set_device_idx": lambda device: cuda.set_device(device),
        "device_index": cuda.device, "synchronize": lambda device=None: cuda.synchronize(device),
        "current_stream": _stream, "set_stream": lambda s: STATE.streams.__setitem__(s.device_index, s),
        "empty_cache": lambda: cuda.empty_cache(), "empty_host_cache": lambda: None,
        "get_device_capability": lambda device=None: {"supported_dtypes": [torch.float32, torch.float16, torch.bfloat16]},
        "get_memory_info": lambda device=None: memory.mem_get_info(STATE, device),
    }
    for name, fn in memory.functions(STATE).items():
        if hasattr(torch.accelerator, name):
            acc[name] = fn
    return acc


CUDNN_VERSION = 91002  # cuDNN 9.10.2, as torch 2.13's CUDA 12 wheels ship it
NCCL_VERSION = (2, 27, 5)  # as torch 2.13's CUDA 12 wheels ship it (DDP's bf16 hook and c10d's logger ask)


def install_extras(torch) -> None:
    """The rest of coverage.py's REPLACED names: a CUDA build's answers in torch.backends, the legacy
    typed classes as the CPU ones, the profiler's and NVTX's no-ops, NCCL's version, TunableOp off."""
    import torch.backends.cudnn
    import torch.cuda.graphs
    import torch.cuda.nccl
    import torch.cuda.profiler
    import torch.cuda.tunable
    torch.backends.cuda.is_built = lambda: True
    torch.backends.cuda.is_flash_attention_available = lambda: True
    cudnn = getattr(torch.backends.cudnn, "m", torch.backends.cudnn)
    cudnn.is_available, cudnn.version = (lambda: True), (lambda: CUDNN_VERSION)
    for name in dir(torch.cuda):
        if name.endswith(("Tensor", "Storage")) and isinstance(getattr(torch, name, None), type):
            setattr(torch.cuda, name, getattr(torch, name))
    torch.cuda.profiler.start = torch.cuda.profiler.stop = lambda: None
    torch.cuda.profiler.profile = _no_op_ctx
    torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop = (lambda msg: 0), (lambda: 0)
    torch.cuda.nvtx.mark, torch.cuda.nvtx.range = (lambda msg: None), _no_op_ctx
    torch.cuda.nccl.version = lambda: NCCL_VERSION
    torch.cuda.graphs.is_current_stream_capturing = lambda: False
    for name in ("is_enabled", "tuning_is_enabled", "record_untuned_is_enabled"):
        setattr(torch.cuda.tunable, name, lambda: False)


def _own(fn, name: str):
    """A function object of its own for each name it is installed under (torch.compile registers
    its handlers by function object, once each), the same code; a class as is."""
    if not isinstance(fn, types.FunctionType):
        return fn
    new = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__, new.__doc__ = fn.__kwdefaults__, fn.__doc__
    return new


def install_device(torch, count: int, current: int, gpu: str) -> None:
    """Make ``torch.cuda`` and ``torch.accelerator`` answer as ``count`` GPUs of model ``gpu``, the
    current one ``current`` (LOCAL_RANK; torchrun's ranks start on device 0 until set_device, as on
    GPUs the device index is the program's choice: ``current`` is only where it starts)."""
    from simcluster.launcher.instrument.gpu.bindings import install_bindings
    STATE.physical, STATE.current, STATE.model = count, current, GpuModel.named(gpu)
    install_bindings(torch, DeviceProperties)
    mods = [torch.cuda] + [getattr(torch.cuda, m) for m in ("memory", "random", "streams") if hasattr(torch.cuda, m)]
    for name, fn in functions(torch).items():
        for mod in mods:
            if mod is torch.cuda or hasattr(mod, name):
                setattr(mod, name, _own(fn, name))
    install_extras(torch)
    for name, fn in accelerator_functions(torch).items():
        setattr(torch.accelerator, name, _own(fn, name))
        if hasattr(torch.accelerator, "memory") and hasattr(torch.accelerator.memory, name):
            setattr(torch.accelerator.memory, name, _own(fn, name))
