"""The simulated device's answers to ``torch.cuda`` and ``torch.accelerator``: a node's ranks are
its GPUs, each rank's tensors live on its CPU.

    python -c "from simcluster.launcher.instrument.gpu.device import GpuModel; print(GpuModel.named('h100-sxm'))"

``install_device`` replaces, in the ``torch.cuda`` and ``torch.accelerator`` modules, the functions
a CPU build of torch cannot answer: availability (True), ``device_count`` (the node's ranks,
torchrun's LOCAL_WORLD_SIZE), the current device (``set_device``/``current_device``/``device``
keep a local index), the device's name, capability, properties and ``mem_get_info`` (from the
planner's hardware model, simcluster/core/hardware.py), streams and events (gpu/streams.py),
``synchronize``, ``empty_cache``, the RNG (the CPU default generator: one generator for host and
device, seeded at install with CUDA's fixed default seed) and the memory statistics
(gpu/memory.py). An index beyond the node's ranks raises torch's own CUDA error.
"""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

from simcluster.launcher.instrument.gpu.state import STATE
from simcluster.core.hardware import GPU_ALIASES, HARDWARE

CUDA_DEFAULT_SEED = 67280421310721  # c10::detail::default_rng_seed_val: a CUDA generator's seed until seeded
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
        self.uuid = f"00000000-0000-0000-0000-{index:012d}"
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


class device:  # noqa: N801 - torch.cuda.device's name
    """``torch.cuda.device(i)``: the current device inside the block."""

    def __init__(self, device):
        self.idx = -1 if device is None else STATE.index(device)

    def __enter__(self):
        self.prev = STATE.current
        if self.idx >= 0:
            STATE.current = self.idx

    def __exit__(self, *exc):
        STATE.current = self.prev
        return False


def _stream(device=None):
    from simcluster.launcher.instrument.gpu.streams import Stream
    i = STATE.index(device)
    if i not in STATE.default_streams:
        STATE.default_streams[i] = Stream(i)
    return STATE.streams.get(i) or STATE.default_streams[i]


def _default_stream(device=None):
    _stream(device)
    return STATE.default_streams[STATE.index(device)]


def _set_device(device) -> None:
    STATE.current = STATE.index(device)


def _properties(device=None) -> DeviceProperties:
    return DeviceProperties(STATE.model, STATE.index(device))


def _sync(device=None) -> None:
    STATE.index(device)


def functions(torch) -> dict:
    """name -> the simulated function, for ``torch.cuda`` (its submodules get the same names)."""
    from simcluster.launcher.instrument.gpu import memory, streams
    gen = torch.default_generator
    cuda = {
        "is_available": lambda: True, "is_initialized": lambda: True, "init": lambda: None,
        "_lazy_init": lambda: None, "device_count": lambda: STATE.count, "current_device": lambda: STATE.current,
        "set_device": _set_device, "device": device, "device_of": lambda obj: device(None),
        "get_device_name": lambda device=None: STATE.model.name,
        "get_device_capability": lambda device=None: (STATE.model.major, STATE.model.minor),
        "get_device_properties": _properties, "get_arch_list": lambda: ["sm_80", "sm_90"],
        "is_bf16_supported": lambda including_emulation=True: True, "is_tf32_supported": lambda: True,
        "is_current_stream_capturing": lambda: False, "synchronize": _sync, "empty_cache": lambda: None, "ipc_collect": lambda: None,
        "Stream": streams.Stream, "Event": streams.Event, "StreamContext": streams.StreamContext,
        "stream": streams.StreamContext, "current_stream": _stream, "default_stream": _default_stream,
        "set_stream": lambda s: STATE.streams.__setitem__(s.device_index, s),
        "manual_seed": lambda seed: gen.manual_seed(int(seed)), "manual_seed_all": lambda seed: gen.manual_seed(int(seed)),
        "seed": lambda: gen.seed(), "seed_all": lambda: gen.seed(), "initial_seed": lambda: gen.initial_seed(),
        "get_rng_state": lambda device="cuda": gen.get_state(), "set_rng_state": lambda s, device="cuda": gen.set_state(s),
        "get_rng_state_all": lambda: [gen.get_state()] * STATE.count,
        "set_rng_state_all": lambda states: gen.set_state(states[STATE.current]),
    }
    cuda.update(memory.functions(STATE))
    return cuda


def accelerator_functions(torch) -> dict:
    """name -> the simulated function, for ``torch.accelerator`` (the same device, as CUDA's)."""
    from simcluster.launcher.instrument.gpu import memory
    acc = {
        "is_available": lambda: True, "device_count": lambda: STATE.count,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: STATE.current, "current_device_idx": lambda: STATE.current,
        "set_device_index": _set_device, "set_device_idx": _set_device, "device_index": device,
        "synchronize": _sync, "current_stream": _stream, "set_stream": lambda s: STATE.streams.__setitem__(s.device_index, s),
        "empty_cache": lambda: None, "empty_host_cache": lambda: None,
        "get_device_capability": lambda device=None: {"supported_dtypes": [torch.float32, torch.float16, torch.bfloat16]},
        "get_memory_info": lambda device=None: memory.mem_get_info(STATE),
    }
    for name, fn in memory.functions(STATE).items():
        if hasattr(torch.accelerator, name):
            acc[name] = fn
    return acc


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
    STATE.count, STATE.current, STATE.model = count, current, GpuModel.named(gpu)
    torch.default_generator.manual_seed(CUDA_DEFAULT_SEED)
    mods = [torch.cuda] + [getattr(torch.cuda, m) for m in ("memory", "random", "streams") if hasattr(torch.cuda, m)]
    for name, fn in functions(torch).items():
        for mod in mods:
            if mod is torch.cuda or hasattr(mod, name):
                setattr(mod, name, _own(fn, name))
    torch.cuda.nvtx.range_push = lambda msg: 0
    torch.cuda.nvtx.range_pop = lambda: 0
    torch.cuda.nvtx.mark = lambda msg: None
    torch.cuda.nvtx.range = _no_op_ctx
    for name, fn in accelerator_functions(torch).items():
        setattr(torch.accelerator, name, _own(fn, name))
        if hasattr(torch.accelerator, "memory") and hasattr(torch.accelerator.memory, name):
            setattr(torch.accelerator.memory, name, _own(fn, name))
