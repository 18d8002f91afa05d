"""Device choice of a rank: pure functions of --device and LOCAL_RANK, so the cuda branch is
testable on a CPU machine.

    python -c "from simcluster.train.device import *; print(backend('cuda'), rank_device('cuda', 3))"

cpu: the gloo backend, tensors and the device mesh on the CPU (what the simulation runs).
cuda: the nccl backend, the device mesh on cuda, each rank on GPU LOCAL_RANK
(torch.cuda.set_device before the process group starts, and the group's ``device_id``, so NCCL
binds the right GPU and its barriers know it).
"""
from __future__ import annotations


def backend(device: str) -> str:
    """The process-group backend of a device: gloo for cpu, nccl for cuda."""
    return {"cpu": "gloo", "cuda": "nccl"}[device]


def mesh_device_type(device: str) -> str:
    """init_device_mesh's device_type: "cpu" or "cuda"."""
    return {"cpu": "cpu", "cuda": "cuda"}[device]


def rank_device(device: str, local_rank: int) -> str:
    """Where a rank's parameters and batches live: "cpu", or "cuda:LOCAL_RANK"."""
    return "cpu" if device == "cpu" else f"cuda:{local_rank}"


def process_group_device(device: str, local_rank: int) -> str | None:
    """init_process_group's ``device_id``: "cuda:LOCAL_RANK" on cuda, None (leave it out) on cpu.

    On cuda it binds the group to the rank's GPU, so NCCL's barrier knows its device instead of
    warning that it guesses the current one; on cpu torch refuses it (``ValueError``: "must be an
    accelerator with an index", ../shared/notes).
    """
    return None if device == "cpu" else rank_device(device, local_rank)


def bind(device: str, local_rank: int) -> str:
    """Select this rank's GPU (cuda) before the process group starts; returns rank_device.

    Raises:
        RuntimeError: cuda asked for but this node has no GPU LOCAL_RANK (names the fix).
    """
    where = rank_device(device, local_rank)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
            raise RuntimeError(f"--device cuda: rank with LOCAL_RANK={local_rank} has no GPU (cuda available: "
                               f"{torch.cuda.is_available()}, {torch.cuda.device_count()} GPUs); request one GPU per "
                               f"rank (--nproc-per-node <= GPUs) or run with --device cpu")
        torch.cuda.set_device(local_rank)
    return where
