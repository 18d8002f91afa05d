"""The gloo bridge of FSDP2's gradient divide factor: sum, then scale, where NCCL would PREMUL_SUM.

    torchrun --nproc-per-node 2 -m simcluster.launcher.instrument.fsdp_gloo

The gap (torch 2.13): FSDP2 reduce-scatters its gradients with ``ReduceOp.PREMUL_SUM(1/factor)``
once a divide factor is set (``set_gradient_divide_factor``, as frameworks do), and gloo refuses
it: ``Cannot use ReduceOp.PREMUL_SUM with Gloo``. FSDP2's own force-sum path
(``force_sum_reduction_for_comms``, what it does on devices whose collectives only sum) reduces
with SUM and divides after: the bridge takes that path whenever a group of the reduction is gloo's.
The result equals PREMUL_SUM's up to float rounding of the order (scale after the sum, not before).
"""
from __future__ import annotations


def _is_gloo(group) -> bool:
    import torch.distributed as dist
    try:
        return group is not None and dist.get_backend(group) == "gloo"
    except (RuntimeError, ValueError):
        return False


def install(collectives) -> None:
    """Wrap ``_get_gradient_divide_factors`` of FSDP2's collectives module (idempotent)."""
    inner = collectives._get_gradient_divide_factors
    if hasattr(inner, "__simulated__"):
        return

    def factors(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type="", factor=None,
                force_sum_reduction_for_comms=False):
        if factor is not None and (_is_gloo(reduce_scatter_group) or _is_gloo(all_reduce_group)):
            force_sum_reduction_for_comms = True
        return inner(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type, factor,
                     force_sum_reduction_for_comms)
    factors.__simulated__ = inner
    collectives._get_gradient_divide_factors = factors


def _demo() -> None:
    """2 ranks: FSDP2 with a divide factor of 4 on gloo; prints the gradient's sum on each rank."""
    import sys

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    install(_fsdp_collectives)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = fully_shard(torch.nn.Linear(4, 4, bias=False))
    model.set_gradient_divide_factor(4.0)
    model(torch.ones(2, 4) * (dist.get_rank() + 1)).sum().backward()
    total = float(model.weight.grad.full_tensor().sum())
    for turn in range(dist.get_world_size()):  # one rank writes at a time: the lines never interleave
        if turn == dist.get_rank():
            sys.stdout.write(f"{dist.get_rank()} {total}\n")
            sys.stdout.flush()
        dist.barrier()  # the last one also keeps both ranks in the group until both are done
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="2 ranks under torchrun: FSDP2 with a divide factor of 4 on gloo, "
                                        "bridged; each prints its gradient's sum (24.0)").parse_args()
    _demo()
    from simcluster.train.__main__ import exit_now
    exit_now(0)  # no interpreter teardown: a gloo thread outliving it aborts the rank (CI saw it once)
