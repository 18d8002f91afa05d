"""What a full-size prediction reads besides the hardware table: the GPU memory the program does not
allocate itself, the kernels' efficiency, and the check that a --gpu model has what a prediction needs.

    python -c "from simcluster.train.plan.fullsize.device import constants; print(constants('h100-96g'))"

Sources (each figure's own):
- CUDA context: about 500 MiB a process on a Hopper GPU with CUDA 12's lazy module loading
  (assumption: the order NVIDIA's CUDA C++ Programming Guide, "Lazy Loading", describes the saving
  from; no datasheet prints it); outside torch's reserved figure, counted in the fits verdict.
- NCCL: ``NCCL_BUFFSIZE`` 4 MiB a channel and peer direction (NCCL's environment variables
  documentation), for the ring of one communicator: 2 directions x 32 channels (assumption: NCCL's
  channel count on 8 NVLink-connected H100s) x 4 MiB = 256 MiB a communicator, one per group the run
  made; outside torch's reserved figure.
- cuBLAS workspace: torch's default on Hopper, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` = 32 MiB
  (torch/csrc/cuda/CublasHandlePool.cpp), allocated through the caching allocator: in reserved.
- launch queue: a CPU that runs ahead of its GPU blocks once about 1,000 kernels are pending on a
  stream (measured: Stack Overflow question 53970187, "CUDA stream is blocked when launching many
  kernels (>1000)"; NVIDIA documents no figure): LAUNCH_QUEUE, an assumption, how far the program's
  frees run ahead of the GPU (memory.py's record_streams).
- kernel efficiency: the fraction of the datasheet's dense tensor-core peak a matmul reaches, and
  of the memory bandwidth an elementwise op reaches. MATMUL_EFFICIENCY is the one constant fitted
  (bench/fullsize.py), on torchtitan's Llama 3.1 8B FSDP row of its H100 benchmark only (5,762 tokens/s
  a GPU); BANDWIDTH_EFFICIENCY 0.7 is an assumption, not fitted.
"""
from __future__ import annotations

from simcluster.core.errors import ConfigError
from simcluster.core.hardware import GPU_ALIASES, HARDWARE, NAMES, Hardware

MiB = 1 << 20
CUDA_CONTEXT = 500 * MiB
NCCL_PER_GROUP = 2 * 32 * 4 * MiB
CUBLAS_WORKSPACE = 32 * MiB
LAUNCH_QUEUE = 1000
MATMUL_EFFICIENCY = 0.50
BANDWIDTH_EFFICIENCY = 0.7
NEEDS = ("bf16_flops", "flops", "memory", "memory_bw", "intra_bw", "inter_bw", "ranks_per_node")


def constants(gpu: str) -> Hardware:
    """The hardware model (simcluster/core/hardware.py's Hardware: bytes, FLOP/s, bytes/s) of --gpu ``gpu`` (a GPU alias or a hardware name of simcluster/core/hardware.py).

    Raises:
        ConfigError: an unknown name (the known ones listed), or a model without the constants a
            prediction needs (``local``: it has no per-device memory or tensor-core peak), naming them.
    """
    name = GPU_ALIASES.get(gpu, gpu)
    if name not in HARDWARE:
        if name in NAMES:
            raise ConfigError(f"gpu: {gpu!r} has none of the constants a full-size prediction needs "
                              f"({', '.join(NEEDS)} of one device); choose one of {', '.join(HARDWARE)}, "
                              f"e.g. --gpu h100-96g")
        raise ConfigError(f"gpu: unknown model {gpu!r}; choose one of {', '.join((*GPU_ALIASES, *HARDWARE))}, "
                          f"e.g. --gpu h100-96g")
    hw = HARDWARE[name]
    missing = [n for n in NEEDS if not getattr(hw, n, 0)]
    if missing:
        raise ConfigError(f"gpu: {gpu!r} lacks {', '.join(missing)} (simcluster/core/hardware.py), which a full-size "
                          f"prediction needs; e.g. --gpu h100-96g")
    return hw
