"""The CPU bridge of compiled activation checkpointing that saves a DeviceMesh: the CPU's RNG states
put where AOT autograd's runtime reads saved tensors, as the CUDA path never needs to.

    python -m simcluster.launcher.instrument.compile_rng eager compiled bridged   # demo() of each, in this order

The gap (torch 2.13, CPU, no simulation needed): a ``torch.compile``d region under activation
checkpointing (``checkpoint_wrapper``, torchtitan's default AC) that holds a random op (every SDPA
kernel is tagged ``nondeterministic_seeded``) and a DTensor (its DeviceMesh, an opaque object, is
saved for backward) fails in the first forward with ``AssertionError: expected all
tensors_saved_with_vc_check to be Tensors, got ... DeviceMesh`` (AOT autograd's
``save_from_forward``). The partitioner lays the forward's saved outputs out as tensors, opaque
objects, symints (``_extract_fwd_bwd_modules``), and the runtime slices them so. To recompute the
random op in the backward, ``functionalize_rng_ops`` adds one RNG state per op: on CUDA (a
"graphsafe" device, ``_GRAPHSAFE_RNG_DEVICE_TYPES``) the generator is threaded through the graphs
and no output is added; on the CPU each state is a new forward output inserted just before the
symints, that is after the opaque objects, and a backward input before the tangents, after them.
The runtime then reads the DeviceMesh as a saved tensor. ``install`` has torch's own
``functionalize_rng_ops`` insert the states before the opaque objects, in both graphs: the order
the runtime reads, the same values (tests/test_simulated_gpus.py: compiled = eager). A later torch
that adds no state after an opaque object is left as it is (nothing is moved).
"""
from __future__ import annotations

import json
import sys


def install() -> bool:
    """Wrap ``torch._functorch.partitioners.functionalize_rng_ops`` (idempotent); True when wrapped now."""
    import torch._functorch.partitioners as partitioners
    inner = partitioners.functionalize_rng_ops
    if hasattr(inner, "__simulated__"):
        return False

    def functionalize(joint_module, fw_module, bw_module, num_sym_nodes):
        outputs = next(iter(fw_module.graph.find_nodes(op="output"))).args[0]
        opaque = 0
        for node in reversed(outputs[:len(outputs) - num_sym_nodes]):
            if not partitioners.is_opaque_node(node):
                break
            opaque += 1
        if not opaque:
            return inner(joint_module, fw_module, bw_module, num_sym_nodes)
        before = set(bw_module.graph.find_nodes(op="placeholder"))
        fw_module, bw_module = inner(joint_module, fw_module, bw_module, num_sym_nodes + opaque)
        _states_before_opaque(bw_module, before, partitioners.is_opaque_node)
        return fw_module, bw_module

    functionalize.__simulated__ = inner
    partitioners.functionalize_rng_ops = functionalize
    return True


def _states_before_opaque(bw_module, before: set, is_opaque) -> None:
    """Move the backward's new placeholders (the RNG states) before its first opaque placeholder."""
    placeholders = list(bw_module.graph.find_nodes(op="placeholder"))
    first = next((p for p in placeholders if p in before and is_opaque(p)), None)
    if first is None:
        return
    for node in placeholders:
        if node not in before:
            first.prepend(node)
    bw_module.recompile()


def demo(mode: str) -> dict:
    """One process (a gloo world of 1): an attention block, its two Linears tensor-parallel on a
    1-device CPU mesh, under ``checkpoint_wrapper``; forward and backward of a seeded (2, 8, 16) input.

    mode: "eager" (not compiled), "compiled" (``torch.compile``, backend aot_eager: AOT autograd's
    partitioner and runtime, no C++ compiler needed) or "bridged" (compiled, after ``install``).
    Returns {"loss": float, "grad": the sum of |wq's gradient|} or {"error": "Type: message"}.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wo = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            q = self.wq(x).view(2, 8, 2, 8).transpose(1, 2)
            return self.wo(F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(2, 8, 16))

    if mode == "bridged":
        install()
    torch._dynamo.reset()  # each mode compiles anew
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = Block()
        parallelize_module(model, init_device_mesh("cpu", (1,)), {"wq": ColwiseParallel(), "wo": RowwiseParallel()})
        model = checkpoint_wrapper(model)
        if mode != "eager":
            model = torch.compile(model, backend="aot_eager")
        loss = model(torch.randn(2, 8, 16)).sum()
        loss.backward()
        grad = model.get_submodule("_checkpoint_wrapped_module.wq" if mode == "eager" else
                                   "_orig_mod._checkpoint_wrapped_module.wq").weight.grad
        return {"loss": loss.item(), "grad": grad.full_tensor().abs().sum().item()}
    except AssertionError as e:
        return {"error": f"AssertionError: {str(e)[:400]}"}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps({mode: demo(mode) for mode in sys.argv[1:] or ["bridged"]}))
