"""The layer under ``torch.cuda``'s own Python, simulated: the ``torch._C._cuda_*`` bindings a CPU
build lacks and the module state CUDA's initialization sets, so torch's own functions run unchanged.

    python -c "from simcluster.launcher.instrument.gpu.bindings import BINDINGS; print(sorted(BINDINGS))"

Most of ``torch.cuda`` is Python over a few bindings (torch/cuda/__init__.py, random.py): with these
answered, torch's own ``is_available``, ``device_count``, ``current_device``, ``set_device`` (a
negative index a no-op, as torch documents), ``device``/``device_of``, ``get_device_properties``,
``get_device_name``/``_capability`` (an index beyond ``device_count()`` raises torch's own
``AssertionError: Invalid device id``, as on GPUs), ``synchronize``, ``can_device_access_peer``,
``get_arch_list`` and the whole RNG (``manual_seed*``, ``seed*``, ``initial_seed``,
``get_rng_state*``/``set_rng_state*`` over ``torch.cuda.default_generators``) give a GPU's answers
with no copy of their logic here. Chosen over wrapping each public name because the verdicts
(ordinal checks, negative indices, lazy seeding) are then torch's own by construction, and a new
public function over the same bindings works without a line here; the count is in coverage.py.

``default_generators``: one independent generator per visible device, as CUDA has. A "cuda" tensor is
a CPU tensor and CPU kernels draw from torch's CPU default generator, so the current device's entry
*is* that generator (the state of the others kept in their own CPU generators): a change of device
(``set_device``, ``with torch.cuda.device(i)``) puts the old device's state aside and the new one's
in. So ``torch.cuda.manual_seed(s)`` seeds the current device only, ``manual_seed_all`` every one,
``get_rng_state(i)``/``set_rng_state(s, i)`` are per device, a CUDA RNG tracker's get/set/fork
round-trips work, and a factory given another device than the current one (``torch.randn(3,
device="cuda:1")`` on device 0) draws from that device's generator (gpu/tensors.py passes it as
``generator=``). An in-place draw on a tensor of another device (``x.normal_()``) draws from the
current device's. Each device starts seeded with CUDA's fixed default seed.
"""
from __future__ import annotations

from collections.abc import Sequence

from simcluster.launcher.instrument.gpu.state import STATE

CUDA_DEFAULT_SEED = 67280421310721  # c10::detail::default_rng_seed_val: a CUDA generator's seed until seeded
_CUDNN_LIMIT = [10]  # torch.backends.cudnn.benchmark_limit (torch's default)
_SYNC_DEBUG = [0]  # torch.cuda.set_sync_debug_mode's value (no sync is ever reported: nothing is asynchronous)


_OWN: dict = {}  # device index -> its own CPU generator (its state while the device is not current)
_LIVE = [0]  # the device whose state the CPU default generator holds


def own_generator(i: int):
    """Device ``i``'s generator: the CPU default generator for the current device, else its own."""
    import torch
    if i == _LIVE[0]:
        return torch.default_generator
    if i not in _OWN:
        g = torch.Generator()
        g.manual_seed(CUDA_DEFAULT_SEED)
        _OWN[i] = g
    return _OWN[i]


def switch_generator(new: int) -> None:
    """The current device became ``new``: its generator's state into the CPU default generator, the
    previous device's put aside (a STATE listener)."""
    import torch
    old = _LIVE[0]
    if new == old:
        return
    incoming = own_generator(new)
    _OWN.setdefault(old, torch.Generator()).set_state(torch.default_generator.get_state())
    torch.default_generator.set_state(incoming.get_state())
    _LIVE[0] = new


class Generators(Sequence):
    """``torch.cuda.default_generators``: one entry per visible device (read at first use, as CUDA's
    initialization does), each that device's generator (``own_generator``)."""

    def __len__(self) -> int:
        return STATE.count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(own_generator(j) for j in range(len(self))[i])
        if not -len(self) <= i < len(self):
            raise IndexError("tuple index out of range")
        return own_generator(i % len(self))

    def __repr__(self):
        return repr(tuple(self))


def _set_device(i: int) -> None:
    STATE.current = STATE.index(int(i))


def _exchange(i: int) -> int:
    """CUDA's exchange_device: make ``i`` current, return the previous index (-1: nothing changes)."""
    if i < 0:
        return -1
    prev, STATE.current = STATE.current, STATE.index(int(i))
    return prev


def _maybe_exchange(i: int) -> int:
    """CUDA's maybe_exchange_device, as _exchange here (no context is created either way); a function of its
    own: dynamo keys its handlers by function, one for each of torch.cuda's two names."""
    return _exchange(i)


def _arch_flags() -> str:
    own = f"sm_{STATE.model.major}{STATE.model.minor}"
    return " ".join(sorted({"sm_80", "sm_90", own}))


def _torch():
    import torch
    return torch


def _nested(flat: dict) -> dict:
    """torch.cuda.memory_stats' dotted keys ("allocated_bytes.all.current") as the allocator's nested dict."""
    out: dict = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


BINDINGS = {  # torch._C name -> the simulated binding
    "_cuda_getDeviceCount": lambda: STATE.count,
    "_cuda_getDevice": lambda: STATE.current,
    "_cuda_setDevice": _set_device,
    "_cuda_exchangeDevice": _exchange,
    "_cuda_maybeExchangeDevice": _maybe_exchange,
    "_cuda_init": lambda: None,
    "_cuda_synchronize": lambda: None,
    "_cuda_ipc_collect": lambda: None,
    "_cuda_getArchFlags": _arch_flags,
    "_cuda_getCurrentRawStream": lambda device: 0,  # the null stream (dynamo's device interface imports it)
    "_cuda_canDeviceAccessPeer": lambda a, b: STATE.index(a) != STATE.index(b),  # NVLink within a node
    "_cuda_getAllocatorBackend": lambda: "native",
    "_cuda_memoryStats": lambda device: _nested(_torch().cuda.memory_stats(device)),
    "_cuda_hostMemoryStats": lambda: {},  # nothing is pinned: pin_memory returns the tensor itself
    "_cuda_resetPeakHostMemoryStats": lambda: None,
    "_cuda_resetAccumulatedHostMemoryStats": lambda: None,
    "_cuda_get_cudnn_benchmark_limit": lambda: _CUDNN_LIMIT[0],
    "_cuda_set_cudnn_benchmark_limit": lambda n: _CUDNN_LIMIT.__setitem__(0, int(n)),
    "_cuda_get_sync_debug_mode": lambda: _SYNC_DEBUG[0],
    "_cuda_set_sync_debug_mode": lambda mode: _SYNC_DEBUG.__setitem__(0, int(mode)),
}


def install_bindings(torch, properties) -> None:
    """Answer the bindings above in ``torch._C`` and set ``torch.cuda``'s initialized state, its
    ``_get_device_properties`` answered by ``properties(model, node_index)`` (the device count is not
    read here: CUDA_VISIBLE_DEVICES may still change until the first question)."""
    for name, fn in BINDINGS.items():
        setattr(torch._C, name, fn)
    # a type a CUDA build defines and inductor's cudagraph_trees imports once is_built() says True
    # (torch._dynamo.reset() imports it): a bare class, as torch's own non-CUDA branch defines it
    torch._C._cuda_CUDAAllocator_AllocatorState = type("_CUDAAllocator_AllocatorState", (), {})
    cuda = torch.cuda
    cuda._exchange_device, cuda._maybe_exchange_device = _exchange, _maybe_exchange
    cuda._get_device_properties = lambda i: properties(STATE.model, STATE.seen[STATE.index(i)])
    cuda.default_generators = Generators()
    cuda._cached_device_count = None
    cuda._initialized = True  # as after torch._C._cuda_init(): torch's queued capability checks do not apply
    torch.default_generator.manual_seed(CUDA_DEFAULT_SEED)
    _LIVE[0] = STATE.current
    STATE.listeners.append(switch_generator)
