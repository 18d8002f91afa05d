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
- attention: torch's SDPA flash backend is FlashAttention-2; its measured rate on an H100 80GB SXM5,
  head dim 128, causal, sequence 8k-16k: about 335 TFLOPS forward and 320 backward (Shah et al.,
  "FlashAttention-3", arXiv 2407.08608, Figures: attention forward / backward speed, head dim 128).
  ATTENTION_RATE: FLOP/s by op name, for the Hopper models (h100-96g: a 500 W HBM2e part, no
  figure of its own; h200: the same compute die), for bf16/fp16 inputs; other models, and float32
  attention (FlashAttention has no float32 kernel), time attention as a matmul.
- kernel efficiency: the fraction of the datasheet's dense tensor-core peak a matmul reaches, and
  of the memory bandwidth an elementwise op reaches. MATMUL_EFFICIENCY is the one constant fitted
  (bench/fullsize.py), on torchtitan's Llama 3.1 8B FSDP row of its H100 benchmark only (5,762 tokens/s
  a GPU), traced from the program that row ran (torchtitan 9dec370): 0.5295, rounded; BANDWIDTH_EFFICIENCY
  0.7 is an assumption, not fitted.
"""
from __future__ import annotations

from simcluster.core.errors import ConfigError
from simcluster.core.hardware import GPU_ALIASES, HARDWARE, NAMES, Hardware

MiB = 1 << 20
CUDA_CONTEXT = 500 * MiB
NCCL_PER_GROUP = 2 * 32 * 4 * MiB
CUBLAS_WORKSPACE = 32 * MiB
LAUNCH_QUEUE = 1000
_FA2_H100 = {"_scaled_dot_product_flash_attention": 335e12, "_scaled_dot_product_flash_attention_for_cpu": 335e12,
             "_scaled_dot_product_flash_attention_backward": 320e12,
             "_scaled_dot_product_flash_attention_for_cpu_backward": 320e12}
ATTENTION_RATE = {"h100-96g": _FA2_H100, "h100-sxm-8x": _FA2_H100, "h200": _FA2_H100}
MATMUL_EFFICIENCY = 0.53
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
