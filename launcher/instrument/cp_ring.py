"""Context parallel on CPU: torch's ring attention for the CPU flash op, as torch runs it for the CUDA ones.

    python -c "import simcluster.launcher.instrument.cp_ring as c; print(c.install())"
    torchrun --nproc-per-node 2 -m simcluster.launcher.instrument.bridges examples/context_parallel.py

torch 2.13's context parallel (torch.distributed.tensor.experimental.context_parallel) shards q, k,
v on the sequence (Shard(2) on the CP mesh) and hands the attention op to a handler of its own
(torch/distributed/tensor/experimental/_context_parallel/_attention.py: ``custom_ops``, enabled
while CP is, and ``_sdpa_handler``), which runs the ring: K/V rotated among the CP ranks, the local
kernel on each block, the blocks merged by their logsumexp (online softmax), causal load balancing
by round-robin chunks. It lists the CUDA ops only (flash, efficient, cuDNN); on CPU,
F.scaled_dot_product_attention runs aten._scaled_dot_product_flash_attention_for_cpu, so CP fell
through to the plain DTensor strategy (bridges.py), which computed the whole sequence.

The rules of bridges.py hold: the ring is torch's own (``_templated_ring_attention`` and its
backward, op-agnostic: they take the op to call), the local math the CPU kernel torch itself runs,
the rotation and load balancing CP's options (``set_rotate_method``, ``_cp_options``); this module
adds the handler table entries and CP's Shard(2) strategy for the CPU ops (bridges.py appends it
while CP is on, as torch's _sharding_rules.py does for the CUDA ops). ``install`` skips an op CP
already handles (a later torch that closes the gap wins).

Torch-free at import (the launcher imports every module without torch): torch is imported inside
the functions, in the ranks.
"""
from __future__ import annotations

SEQ_DIM = 2  # the sequence dim of q, k, v (batch, heads, seq, head_dim), as torch's CP hard-codes it
FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"

_MINE: set[str] = set()  # the ops this process added to CP's handler table (install is idempotent)


def _no_mask(attn_mask) -> None:
    """Raise NotImplementedError for an attn_mask: torch's ring takes none (its CUDA handlers refuse
    attn_bias); a causal mask is is_causal=True, which the ring balances."""
    if attn_mask is not None:
        raise NotImplementedError(
            "context parallel (torch's ring attention) takes no attn_mask: pass is_causal=True for a causal "
            "mask, or leave context parallel off for this attention")


def ring_forward(mesh, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """The ring attention forward on this rank's sequence shard, with the CPU flash kernel.

    mesh: the 1-D CP DeviceMesh; query, key, value: local (batch, heads, seq/cp, head_dim) tensors,
    in CP's load-balanced order when is_causal. Returns (output (batch, heads, seq/cp, head_dim),
    logsumexp (batch, heads, seq/cp)) as aten._scaled_dot_product_flash_attention_for_cpu returns
    them for the whole sequence. Raises NotImplementedError for an attn_mask.
    """
    import torch
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    _no_mask(attn_mask)
    return cp._templated_ring_attention(
        mesh.get_group(), SEQ_DIM, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
        query=query, key=key, value=value, is_causal=is_causal, dropout_p=dropout_p, scale=scale)


def ring_backward(mesh, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                  attn_mask=None, scale=None):
    """The ring attention backward on this rank's shard, with the CPU flash kernel's backward.

    Arguments as aten._scaled_dot_product_flash_attention_for_cpu_backward's, local shards of
    (batch, heads, seq/cp, head_dim) (logsumexp without head_dim); K/V and their gradients travel
    the ring as in torch's _templated_ring_attention_backward. Returns (grad_query, grad_key,
    grad_value) shaped as the shards. Raises NotImplementedError for an attn_mask.
    """
    import torch
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    _no_mask(attn_mask)
    return cp._templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        grad_out=grad_out, grad_out_name="grad_out", query=query, key=key, value=value, out=out,
        logsumexp=logsumexp, is_causal=is_causal, dropout_p=dropout_p, scale=scale)


def handler(op_call, args, kwargs):
    """CP's DTensor handler for the CPU flash op and its backward, as torch's _sdpa_handler for the
    CUDA ops: the sharding propagated (CP's Shard(2) strategy, no redistribution), the ring run on
    the local shards, the results wrapped as DTensors. Raises AssertionError where the inputs would
    need a redistribution (q, k, v not all Shard(2) on the CP mesh), as torch's handler does."""
    import torch
    from torch.distributed.tensor import DTensor
    ring = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: ring_forward,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default: ring_backward}[op_call]
    dispatcher = DTensor._op_dispatcher
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if sharding is None or sharding.needs_redistribute:
        raise AssertionError(f"context parallel on CPU: {op_call} needs q, k, v sharded on the sequence "
                             f"(Shard({SEQ_DIM})) on the CP mesh, got {op_info.schema}")
    local = ring(op_info.compute_mesh, *op_info.local_args, **op_info.local_kwargs)
    return dispatcher.wrap(local, sharding.output_spec)


def cp_on() -> bool:
    """Whether context parallel's dispatcher is on in this process (torch merges CP's handler table
    into DTensor's custom handlers while a context_parallel() context is open, or between
    _enable_context_parallel_dispatcher and its disable, torchtitan's way), read from those handlers."""
    import torch
    from torch.distributed.tensor import DTensor
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    return DTensor._op_dispatcher._custom_op_handlers.get(op) is handler


def install() -> list[str]:
    """Add the CPU flash op and its backward to CP's handler table (``custom_ops`` of torch's
    _context_parallel/_attention.py, merged into DTensor's handlers while CP is on); returns the ops
    added by this process. Idempotent; an op CP already handles (a later torch) is left alone and
    not named. Raises ImportError without torch."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    aten = torch.ops.aten
    ops = {FORWARD: aten._scaled_dot_product_flash_attention_for_cpu.default,
           BACKWARD: aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
    for name, op in ops.items():
        if name not in _MINE and op not in cp.custom_ops:
            cp.custom_ops[op] = handler
            _MINE.add(name)
    return [name for name in ops if name in _MINE]
