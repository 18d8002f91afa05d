"""Hardware models for the step time: one contract (Hardware), the named GPU targets in HARDWARE, and
``local``, this machine measured by a short micro-benchmark (calibrate.py), found by name in lookup.py.

    python -m launcher plan --mesh 2x2x2 --model small --hardware h100-sxm-8x
    python -m launcher plan --mesh 2x2x2 --model small --hardware local [--recalibrate]

Every number of a named target comes from the document named beside it (dense throughput: the
datasheets print the 2:4-sparse figure first, twice the dense one). The trainer computes in
float32 with torch's default of no TF32 for matmuls (``torch.backends.cuda.matmul.allow_tf32``
False), so ``flops`` is the FP32 (non-tensor-core) peak; ``bf16_flops`` is listed for a run that
would cast. Per-message latency is in no datasheet: the 5 us used is an assumption, the order of
NCCL's small-message latency within a node and over InfiniBand, and says so.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcluster.core.errors import ConfigError
from simcluster.core.units import rate_bits_per_s

G = 1e9


@dataclass(frozen=True)
class Hardware:
    """What the step time reads. Units: FLOP/s, bytes, bytes/s (one direction, per GPU or rank),
    seconds. ranks_per_node: GPUs of one node (local: the ranks of one Compose node, pp stage);
    shared_cores: local only, the cores every rank of the job shares (0: a device per rank);
    node_link: inter_bw is one link per node that its ranks share (local: a container's eth0,
    which --inter-node-bandwidth limits), else each GPU's own port (a DGX: one NIC per GPU);
    shared_latency_s: local only, the per-message latency when the ranks outnumber the cores;
    shared_flops: local only, a core's FLOP/s while every core runs a rank (0: flops);
    collective_cpu: local only, (kind, group size, CPU seconds a call, CPU seconds a byte) of the
    collectives inside an action (collective_cpu_s)."""

    name: str
    flops: float
    bf16_flops: float
    memory: int
    memory_bw: float
    intra_bw: float
    inter_bw: float
    latency_s: float
    ranks_per_node: int
    sources: tuple[str, ...]
    shared_cores: int = 0
    node_link: bool = False
    shared_latency_s: float = 0.0
    shared_flops: float = 0.0
    collective_cpu: tuple[tuple[str, int, float, float], ...] = ()
    device_name: str = ""
    capability: tuple[int, int] = (0, 0)
    sm_count: int = 0
    l2_cache: int = 0


H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: FP32 67 TFLOPS, BF16 1,979 TFLOPS with sparsity, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s)"
DGX_H100_DS = "NVIDIA DGX H100 datasheet (8x H100 SXM, 8x ConnectX-7 400 Gb/s InfiniBand: one 50 GB/s port per GPU)"
A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: FP32 19.5 TFLOPS, BF16 624 TFLOPS with sparsity, 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s)"
DGX_A100_DS = "NVIDIA DGX A100 datasheet (8x A100 80GB SXM, 8x ConnectX-6 200 Gb/s HDR InfiniBand: one 25 GB/s port per GPU)"
TITAN_H100 = ("torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Hardware: Grand Teton, 8 H100 a host fully "
              "connected with NVLink, each with 96GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA a GPU, 500 W power limit")
H100_96G = ("H100 SXM's compute (NVIDIA H100 datasheet: FP32 67 TFLOPS, BF16 989 TFLOPS dense, NVLink 900 GB/s) at "
            "its 700 W rating: the 500 W cap's clocks are not published, the full-size plan's fitted kernel "
            "efficiency carries them")
H200_DS = ("NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: FP32 67 TFLOPS, BF16 1,979 TFLOPS with sparsity, 141 GB "
           "HBM3e at 4.8 TB/s, NVLink 900 GB/s); hosts as torchtitan's H200 benchmark (8 a host, 400 Gb/s a GPU)")
CUDA_NAMES = ("device names, compute capability, SM count and L2 as torch.cuda.get_device_properties reports them "
              "(NVIDIA CUDA C++ Programming Guide, compute capabilities; H100 SXM5: 132 SMs, 50 MB L2; "
              "A100 SXM4: 108 SMs, 40 MB L2, per NVIDIA's Hopper and Ampere architecture whitepapers)")
LATENCY = "assumption: 5 us per message (no datasheet gives one)"

# name -> Hardware; NVLink's datasheet figure is both directions together, halved here
HARDWARE: dict[str, Hardware] = {
    "h100-sxm-8x": Hardware("h100-sxm-8x", flops=67e12, bf16_flops=1979e12 / 2, memory=80 * G, memory_bw=3.35e12,
                            intra_bw=900 * G / 2, inter_bw=400 * G / 8, latency_s=5e-6, ranks_per_node=8,
                            sources=(H100_DS, DGX_H100_DS, LATENCY, CUDA_NAMES), device_name="NVIDIA H100 80GB HBM3",
                            capability=(9, 0), sm_count=132, l2_cache=50 * 2**20),
    "a100-80g-8x": Hardware("a100-80g-8x", flops=19.5e12, bf16_flops=624e12 / 2, memory=80 * G, memory_bw=2.039e12,
                            intra_bw=600 * G / 2, inter_bw=200 * G / 8, latency_s=5e-6, ranks_per_node=8,
                            sources=(A100_DS, DGX_A100_DS, LATENCY, CUDA_NAMES), device_name="NVIDIA A100-SXM4-80GB",
                            capability=(8, 0), sm_count=108, l2_cache=40 * 2**20),
    "h100-96g": Hardware("h100-96g", flops=67e12, bf16_flops=1979e12 / 2, memory=96 * G, memory_bw=2.4e12,
                         intra_bw=900 * G / 2, inter_bw=400 * G / 8, latency_s=5e-6, ranks_per_node=8,
                         sources=(TITAN_H100, H100_96G, LATENCY, CUDA_NAMES), device_name="NVIDIA H100",
                         capability=(9, 0), sm_count=132, l2_cache=50 * 2**20),
    "h200": Hardware("h200", flops=67e12, bf16_flops=1979e12 / 2, memory=141 * G, memory_bw=4.8e12,
                     intra_bw=900 * G / 2, inter_bw=400 * G / 8, latency_s=5e-6, ranks_per_node=8,
                     sources=(H200_DS, LATENCY, CUDA_NAMES), device_name="NVIDIA H200",
                     capability=(9, 0), sm_count=132, l2_cache=50 * 2**20),
}
NAMES = (*HARDWARE, "local")
# --gpu: one GPU of a named target, by the GPU's name or the target's (a simulated rank's device)
GPU_ALIASES = {"h100-sxm": "h100-sxm-8x", "a100-80g": "a100-80g-8x"}
GPU_NAMES = (*GPU_ALIASES, *HARDWARE)


def memory_of_rank(hw: Hardware, world_size: int) -> float:
    """Bytes one rank may hold: a device's memory, or on a machine whose ranks share it (local) its
    memory split over the world's ranks."""
    return hw.memory / world_size if hw.shared_cores else hw.memory


def shaped(hw: Hardware, rate: str) -> Hardware:
    """hw with its network between nodes limited to ``rate`` (tc units, as --inter-node-bandwidth;
    launcher/drills/shaping.py): one link of that rate per node, its ranks sharing it.

    Raises:
        ConfigError: rate is not a tc rate.
    """
    bits = rate_bits_per_s(rate)
    if bits is None or bits <= 0:
        shown = rate if len(str(rate)) <= 40 else f"{str(rate)[:20]}...{str(rate)[-8:]}"
        raise ConfigError(f"inter_node_bandwidth: {shown!r} is not a tc rate above 0 and at most 1 Pbit/s (a number, "
                          f"then bit, kbit, mbit, gbit, tbit or bps ... tbps); e.g. --inter-node-bandwidth 100mbit")
    return dataclasses.replace(hw, name=f"{hw.name} at {rate} between nodes", inter_bw=bits / 8, node_link=True,
                               sources=(*hw.sources, f"--inter-node-bandwidth {rate}: each node's egress (tc tbf)"))
