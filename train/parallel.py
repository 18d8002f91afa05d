"""Tensor parallel and FSDP2, one ``apply_*`` per mesh dimension, plus mesh-free initialization.

    python -m train.parity --mesh 1x2x2 --model tiny --steps 3     # exercises all of this

Layout choice: attention and MLP are tensor parallel (Megatron-style column then row split, one
all-reduce each in forward and backward). The embedding, the norms and the head stay replicated
over tp: with a 256-token byte vocabulary they are 1-2% of the FLOPs, and replicating them keeps
the loss a plain cross-entropy on full logits. Every parameter is then FSDP-sharded over dp.
"""
from __future__ import annotations

import math
import zlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# Source: Shoeybi et al., "Megatron-LM" (2019), section 3; torch.distributed.tensor.parallel.
# The fused projections of train/model.py (wqkv, w13; their rows grouped by head so that a shard
# is whole groups) make each branch one column-parallel then one row-parallel Linear: one
# all-reduce in forward (the row-parallel output) and one in backward (the block input's grad).
# Fusing q/k/v and w1/w3 took 7 DTensor Linears a block to 4 (the gain is in BENCHMARKS.md).
TP_PLAN = {
    "attention.wqkv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w13": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(),
}
SEED_TP_PLAN = {
    "pair1.w1": ColwiseParallel(),
    "pair1.w2": RowwiseParallel(),
    "pair2.w1": ColwiseParallel(),
    "pair2.w2": RowwiseParallel(),
}


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard every block of ``model.layers`` over the 1-D tp mesh with TP_PLAN; in place.

    Inputs and outputs of each block stay plain replicated tensors, so every rank of a tp group
    must get identical inputs (the data loader shards by dp rank only).
    """
    if tp_mesh.size() == 1:
        return model
    for block in model.layers.values():
        plan = SEED_TP_PLAN if hasattr(block, "pair1") else TP_PLAN
        parallelize_module(block, tp_mesh, plan)
    return model


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool = False) -> nn.Module:
    """FSDP2 ``fully_shard`` over the 1-D dp mesh: each block, then the root; in place.

    Params stay float32 (no mixed precision) so the run is comparable with one process.
    ``reshard_after_forward`` defaults to False, as torchtitan does under pipeline parallel: each
    block is all-gathered once per step instead of twice per microbatch. The zero-bubble schedules
    (interleaved-zb, zbv, dualpipev) need it: their weight-gradient pass runs after other
    microbatches' forwards and reads the module's current parameters, which must still be the
    unsharded ones (with resharding, torch 2.13 computes those weight grads against the shards
    and loses them: the grad norm came out 0.6x the reference on 2x2x1).
    """
    if dp_mesh.size() == 1:
        return model
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    return model


def param_seed(seed: int, fqn: str) -> int:
    """A stable per-parameter seed: the same FQN gets the same values on every mesh."""
    return (seed * 1_000_003 + zlib.crc32(fqn.encode())) % (2**63)


def init_value(fqn: str, shape: torch.Size, seed: int, n_layers: int) -> torch.Tensor:
    """The full (unsharded) initial value of one parameter, float32, CPU.

    Norm weights 1, biases 0, linear/embedding weights N(0, 0.02), output projections of each
    residual branch (wo, w2) scaled by 1/sqrt(2*n_layers) (GPT-2 style).
    """
    if "norm" in fqn:
        return torch.ones(shape)
    if fqn.endswith("bias"):
        return torch.zeros(shape)
    std = 0.02 / math.sqrt(2 * n_layers) if fqn.endswith(("wo.weight", "w2.weight")) else 0.02
    gen = torch.Generator().manual_seed(param_seed(seed, fqn))
    return torch.randn(shape, generator=gen) * std


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, n_layers: int) -> None:
    """Initialize every parameter to exactly the single-process value, whatever its sharding.

    Each rank draws the full tensor from its per-FQN generator and keeps its own shard
    (``distribute_tensor(..., src_data_rank=None)``: local slicing, no communication), so a
    model on any mesh equals one built in one process from the same seed. Random ops on CPU
    DTensors do not give that by themselves.
    """
    for fqn, param in model.named_parameters():
        full = init_value(fqn, param.shape, seed, n_layers)
        if isinstance(param, DTensor):
            shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            param.copy_(full)
