"""A GPU program's request on each engine: whether the job is GPU code, how many GPUs a node asks for, and
the --gpu model by the name each engine understands.

    python -c "from simcluster.launcher.engines.gpus import names_of; print(names_of('a100-80g'))"

The rule: your code is GPU code unless you say otherwise (the simulated GPUs are on by default here;
``--no-simulated-gpus`` makes it a CPU job); the built-in trainer keeps ``--device`` (cuda: a GPU
job). A GPU job asks for one GPU per rank on every node. ``--gpu MODEL`` (simcluster/core/hardware.py's
GPU_NAMES; one GPU of a named target) is written in each engine's own vocabulary:

- Slurm: the gres type of ``--gpus-per-node=TYPE:N``, the lowercase family name (``h100``, ``a100``)
  most sites give their GPUs in gres.conf; a site's own names are in ``sinfo -o '%N %G'``. Without
  --gpu the request is untyped (``--gpus-per-node=N``), which every GPU cluster takes.
- Kubernetes: a nodeSelector on ``nvidia.com/gpu.product``, the label NVIDIA's GPU feature discovery
  (part of the GPU operator) puts on each node: the CUDA device name with spaces as dashes.
- SkyPilot: its accelerator name (``sky show-gpus``); a GPU job always names one (SkyPilot asks
  for a model), the simulated default (H100) when --gpu is not given.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcluster.launcher.job.launch import Launch
from simcluster.core.hardware import GPU_ALIASES, HARDWARE


@dataclass(frozen=True)
class GpuNames:
    """One GPU model as each engine names it: slurm (gres type), product (Kubernetes node label value),
    skypilot (accelerator)."""

    slurm: str
    product: str
    skypilot: str


def _product(hardware: str) -> str:
    """nvidia.com/gpu.product as GPU feature discovery writes it: the CUDA device name, spaces -> dashes."""
    return HARDWARE[hardware].device_name.replace(" ", "-")


# the planner's named targets (simcluster/core/hardware.py HARDWARE) -> their GPU's names
NAMES: dict[str, GpuNames] = {
    "h100-sxm-8x": GpuNames("h100", _product("h100-sxm-8x"), "H100"),
    "a100-80g-8x": GpuNames("a100", _product("a100-80g-8x"), "A100-80GB"),
    "h100-96g": GpuNames("h100", _product("h100-96g"), "H100"),
    "h200": GpuNames("h200", _product("h200"), "H200"),
}


def names_of(gpu: str) -> GpuNames:
    """The names of --gpu's model (a GPU name or a target's, simcluster/core/hardware.py GPU_NAMES).

    Raises:
        KeyError: a model no engine names (every GPU_NAMES entry has its names: tests/test_targets.py).
    """
    return NAMES[GPU_ALIASES.get(gpu, gpu)]


def gpu_job(launch: Launch) -> bool:
    """True when each rank of the job uses a GPU: your code unless --no-simulated-gpus, the built-in
    trainer with --device cuda."""
    if launch.train is not None:
        return launch.train.config.device == "cuda"
    return launch.instruments.simulated_gpus


def gpus_per_node(launch: Launch) -> int:
    """GPUs a node asks for: one per rank of a GPU job, none for a CPU job."""
    return launch.nproc_per_node if gpu_job(launch) else 0


def model(launch: Launch) -> GpuNames | None:
    """The names of the model --gpu gave, or None (no --gpu: any GPU the cluster has)."""
    inst = launch.instruments
    return names_of(inst.gpu) if launch.train is None and inst.gpu_given and inst.simulated_gpus else None


def skypilot_accelerator(launch: Launch) -> str | None:
    """``H100:4``: SkyPilot's accelerators of a GPU job (the --gpu model, else the simulated default's), or None."""
    if not gpu_job(launch):
        return None
    names = model(launch) or names_of(launch.instruments.gpu)
    return f"{names.skypilot}:{gpus_per_node(launch)}"
