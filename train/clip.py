"""Gradient clipping by the global L2 norm over every parameter of every stage and shard.

    python -m train.parity --mesh 2x2x2 --model tiny --max-norm 0.05 --steps 5

Stock ``clip_grad_norm_`` fails on a stage that mixes TP (2-D DTensor) and non-TP (1-D DTensor)
parameters ("All operands in aten.stack.default must have the same mesh") and, per stage,
misses the other stages' share. Here each rank sums the squares of its local shards, each
weighted by 1 / (copies of that shard in the world), and one all-reduce over the world adds
them up: every rank gets the exact single-process norm with one collective.

That sum over the world is done dimension by dimension (``groups``: the mesh's tp, dp and pp
groups, each an all-reduce of its own, as torchtitan reduces the norm over the DTensor's mesh and
then over pp), not as one all-reduce of the world group: gloo's ring all-reduce takes 2(n-1)
sequential hops, each a wake-up of the next process, so the world's at 512 ranks is 1,022 hops
where tp, dp then pp (2, 16, 16) take 2 + 30 + 30; the sum is the same (float64, the order of
its terms differs).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Shard


def _local_and_shards(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A tensor's local piece and the number of distinct pieces it is split into."""
    if isinstance(t, DTensor):
        n = 1
        for size, placement in zip(t.device_mesh.shape, t.placements):
            if isinstance(placement, Shard) or type(placement).__name__ == "_StridedShard":
                n *= size
        return t.to_local(), n
    return t, 1


def all_reduce_over(t: torch.Tensor, groups: list | None) -> None:
    """Sum ``t`` over the world in place: one all-reduce per group of ``groups`` (process groups
    whose ranks, crossed, are the world: a mesh's tp, dp and pp groups), or of the world group
    when ``groups`` is None. Collective: call on all ranks with the same groups in the same order."""
    for group in [None] if groups is None else groups:
        dist.all_reduce(t, group=group)


@torch.no_grad()
def clip_grad_norm_(params: list[torch.Tensor], max_norm: float, ranks_per_stage: int,
                    extra: torch.Tensor | None = None, groups: list | None = None) -> torch.Tensor:
    """Clip gradients in place to a global L2 norm of ``max_norm``; returns the pre-clip norm.

    Args:
        params: this rank's parameters (all its local stages).
        max_norm: the bound; <= 0 only measures.
        ranks_per_stage: dp*tp, the ranks that hold one stage between them.
        extra: optional 1-D float64 tensor summed over the world in place, in the same
            all-reduce (the trainer's per-step loss and RSS ride along: one world sync a step).
        groups: the process groups the world sum goes through one by one (``all_reduce_over``);
            None: one all-reduce of the world group.

    Returns:
        The global norm (0-dim float64 tensor), equal on every rank. Collective: call on all ranks.
    """
    total = torch.zeros((), dtype=torch.float64, device=extra.device if extra is not None else None)
    locals_ = []
    for p in params:
        if p.grad is None:
            continue
        local, shards = _local_and_shards(p.grad)
        locals_.append(local)
        # each piece is held by ranks_per_stage / shards ranks of its stage
        total += local.double().pow(2).sum() * shards / ranks_per_stage
    if dist.is_initialized() and dist.get_world_size() > 1:
        if extra is None:
            all_reduce_over(total, groups)
        else:
            both = torch.cat([total.reshape(1), extra])
            all_reduce_over(both, groups)
            extra.copy_(both[1:])
            total = both[0]
    norm = total.sqrt()
    if max_norm > 0:
        coef = float((max_norm / (norm + 1e-6)).clamp(max=1.0))
        if coef < 1.0 and locals_:
            torch._foreach_mul_(locals_, coef)
    return norm
