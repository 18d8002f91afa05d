"""CPU bridges: DTensor sharding strategies that torch registers for the GPU ops only.

    python -c "import simcluster.launcher.instrument.bridges as b; print(b.install())"
    torchrun --nproc-per-node 4 -m simcluster.launcher.instrument.bridges examples/llama_2d.py --steps 3

A rehearsal must be as faithful as torch allows: code written for GPUs runs here with nothing
changed but its device. Where torch 2.13 leaves a CPU-only gap in DTensor, this module bridges it
in the ranks, with the public extension point
``torch.distributed.tensor.experimental.register_sharding``. The rules:

- A bridge mirrors the strategies torch registers for the GPU twin of the op (placements only,
  never new math): the local op on each shard is the CPU kernel torch itself runs, so a bridged
  result equals the one on full tensors (tests/test_bridges.py: forward and backward within 1e-6).
- A bridge never replaces a strategy torch has: ``install`` skips an op that already has one (a
  later torch that closes the gap wins), so it is harmless to call on any torch, any number of times.
- What cannot be bridged from outside the user's code is listed in NOT_BRIDGED with its one-line
  fix, never patched behind the user's back.

Random ops on DTensors on a CPU mesh (shards drawn alike) are bridged by rng.py, installed here too;
context parallel's ring attention for the CPU op by cp_ring.py (its handler and CP's Shard(2) strategy).

The gap it closes (torch 2.13, CPU): F.scaled_dot_product_attention on DTensors runs
aten._scaled_dot_product_flash_attention_for_cpu, which has no DTensor strategy. With
is_causal=True it raises NotImplementedError; without, DTensor traces torch's decomposition of the
op instead (about 30 s at the first call on 2 ranks here) and returns the output Replicate (the
heads gathered); its backward has no decomposition and raises NotImplementedError.

This module is torch-free at import (the launcher imports every module without torch,
tests/test_launcher.py): torch is imported inside the functions, in the ranks. Run as a module,
it installs the bridges and runs the script given (``runpy``), for plain torchrun on the host.
"""
from __future__ import annotations

import os
import runpy
import sys

from simcluster.launcher.instrument import cp_ring, rng

FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"

# op -> what the bridge does (the op the CPU picks for F.scaled_dot_product_attention, and its backward)
BRIDGED: dict[str, str] = {
    FORWARD: "F.scaled_dot_product_attention on DTensors (the CPU flash kernel): q, k, v (batch, heads, seq, "
             "head_dim) all Replicate -> output and logsumexp Replicate; Shard(1) (heads: tensor parallel) -> "
             "Shard(1); Shard(0) (batch) -> Shard(0), as torch's strategy for the CUDA op "
             "aten._scaled_dot_product_flash_attention. An attn_mask must be Replicate (DTensor never "
             "redistributes keyword arguments, and attn_mask is keyword-only here); one that broadcasts over "
             "batch and heads, e.g. (seq_q, seq_k), keeps all three, one with a batch or heads extent runs "
             "replicated (q, k, v gathered).",
    BACKWARD: "its backward: grad_out, q, k, v, out, logsumexp -> grad_q, grad_k, grad_v with the same "
              "placements, as torch's strategy for aten._scaled_dot_product_flash_attention_backward (CUDA).",
    # context parallel: while torch's context_parallel() is on, both ops also take Shard(2) (the sequence)
    # and CP's handler runs torch's ring on the CPU kernel (cp_ring.py)
}

# gap -> (what fails on CPU, the one-line fix in the user's code)
NOT_BRIDGED: dict[str, tuple[str, str]] = {
    "the device": ("torch.accelerator.current_accelerator() is None on CPU, so code that takes its device from "
                   "it (or hard-codes 'cuda') has no device here",
                   'device = torch.accelerator.current_accelerator() or torch.device("cpu")'),
    "the backend": ('dist.init_process_group("nccl") raises "Distributed package doesn\'t have NCCL built in"',
                    "dist.init_process_group(dist.get_default_backend_for_device(device))"),
}

_MINE: set[str] = set()  # the ops this process has bridged (install is idempotent)


def _placements(attn_mask) -> list:
    """The single-mesh-dim strategies [(placement of q, k, v and the outputs, of attn_mask or None)].

    attn_mask: None or the DTensorSpec of a mask broadcastable to (batch, heads, seq_q, seq_k).
    DTensor redistributes positional arguments only (torch 2.13, _dispatch.redistribute_local_args),
    so the keyword-only mask must already be where a strategy wants it: Replicate. A mask that
    broadcasts over batch and heads (size 1 or absent there) is whole on every shard: all three
    strategies; one with a batch or heads extent only fits the all-Replicate one.
    Raises NotImplementedError for a mask sharded on any mesh dim.
    """
    from torch.distributed.tensor import Replicate, Shard
    rep = Replicate()
    if attn_mask is None:
        return [(rep, None), (Shard(1), None), (Shard(0), None)]
    if any(p != rep for p in attn_mask.placements):
        raise NotImplementedError(
            f"simcluster's CPU bridge for scaled_dot_product_attention takes a Replicate attn_mask, got "
            f"{tuple(attn_mask.placements)}: DTensor does not redistribute the keyword-only attn_mask of "
            "aten._scaled_dot_product_flash_attention_for_cpu; replicate it "
            "(mask.redistribute(placements=[Replicate()] * mesh.ndim)) or use is_causal=True")
    leading = attn_mask.shape[max(0, attn_mask.ndim - 4):max(0, attn_mask.ndim - 2)]
    if all(n == 1 for n in leading):
        return [(rep, rep), (Shard(1), rep), (Shard(0), rep)]
    return [(rep, rep)]


def sdpa_cpu_strategies(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """Acceptable shardings of aten._scaled_dot_product_flash_attention_for_cpu, for register_sharding.

    query, key, value: DTensorSpecs of (batch, heads, seq, head_dim); the outputs are output
    (batch, heads, seq_q, head_dim) and logsumexp (batch, heads, seq_q). Returns
    [(output placements, input placements)]: all Replicate, Shard(1) (heads) and Shard(0) (batch),
    the placements torch gives the CUDA flash op (torch/distributed/tensor/_ops/_matrix_ops.py,
    _scaled_dot_product_flash_attention_base_strategies); dropout_p and is_causal get None (not
    tensors), attn_mask see _placements. DTensor's propagator picks the cheapest for the inputs.
    Raises NotImplementedError for a sharded attn_mask.
    """
    return [([p, p], [p, p, p, None, None] + ([m] if m else [])) for p, m in _placements(attn_mask)] + [
        ([s, s], [s, s, s, None, None] + ([m] if m else [])) for s, m in _context_parallel(attn_mask)]


def sdpa_cpu_backward_strategies(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                                 attn_mask=None, scale=None):
    """Acceptable shardings of aten._scaled_dot_product_flash_attention_for_cpu_backward.

    grad_out, query, key, value, out: DTensorSpecs of (batch, heads, seq, head_dim), logsumexp of
    (batch, heads, seq_q); outputs grad_query, grad_key, grad_value shaped as q, k, v. Returns
    [(output placements, input placements)] for all Replicate, Shard(1) and Shard(0), as torch's
    _scaled_dot_product_flash_attention_backward_base_strategies does for the CUDA backward.
    Raises NotImplementedError for a sharded attn_mask.
    """
    return [([p, p, p], [p] * 6 + [None, None] + ([m] if m else [])) for p, m in _placements(attn_mask)] + [
        ([s] * 3, [s] * 6 + [None, None] + ([m] if m else [])) for s, m in _context_parallel(attn_mask)]


def _context_parallel(attn_mask) -> list:
    """CP's strategy [(Shard(2) for q, k, v and the outputs, Replicate or None for attn_mask)] while
    torch's context parallel is on (cp_ring.cp_on), else []: the strategy torch's
    _context_parallel/_sharding_rules.py appends for the CUDA ops only while CP is on, since Shard(2)
    (the sequence) is no valid sharding of attention outside the ring. CP's handler (cp_ring.handler)
    then runs the ring; a mask is refused there. As for torch's own rules, DTensor's sharding cache
    keeps what it chose under CP after CP is off."""
    if not cp_ring.cp_on():
        return []
    from torch.distributed.tensor import Replicate, Shard
    return [(Shard(cp_ring.SEQ_DIM), None if attn_mask is None else Replicate())]


def has_strategy(op) -> bool:
    """Whether DTensor's sharding propagator knows op (an OpOverload) by any of its registries.

    Reads DTensor._op_dispatcher.sharding_propagator (torch.distributed.tensor): op_strategy_funcs,
    op_single_dim_strategy_funcs, op_to_rules; a registry missing in another torch counts as empty.
    """
    from torch.distributed.tensor import DTensor
    prop = DTensor._op_dispatcher.sharding_propagator
    return any(op in getattr(prop, name, {}) for name in
               ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"))


def _key_on_mask_and_scalars(op) -> None:
    """Make DTensor's sharding cache tell calls of op apart by attn_mask and the scalar arguments.

    register_sharding derives the cache key's static arguments from int arguments only, and a
    keyword tensor enters the key only when named in static_kwargkey: without this, a call with a
    (2, 4, 8, 8) mask reused the strategy chosen for an (8, 8) mask and failed in the kernel
    ("shape '[2, 1, 8, 8]' is invalid for input of size 512"). Sets the op's RuntimeSchemaInfo
    (torch.distributed.tensor._op_schema, private in torch 2.13) in the propagator's op_to_schema_info.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    first_scalar = next(i for i, a in enumerate(op._schema.arguments) if a.name == "dropout_p")
    DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(
        static_argnum=first_scalar, static_kwargkey=["attn_mask", "scale"], needs_pytree=True)


def install() -> list[str]:
    """Register every bridge of BRIDGED that torch lacks, and the CPU RNG tracker of DTensor's random
    ops (instrument/rng.py); returns the names of the ops bridged.

    Idempotent: an op bridged before by this process is named again, not registered twice; an op
    torch already has a strategy for (a later torch) is left alone and not named. Registers with
    torch.distributed.tensor.experimental.register_sharding (experimental in torch 2.13). Raises
    ImportError without torch.
    """
    import torch
    from torch.distributed.tensor.experimental import register_sharding
    aten = torch.ops.aten
    ops = {FORWARD: (aten._scaled_dot_product_flash_attention_for_cpu.default, sdpa_cpu_strategies),
           BACKWARD: (aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                      sdpa_cpu_backward_strategies)}
    for name, (op, fn) in ops.items():
        if name not in _MINE and not has_strategy(op):
            register_sharding(op)(fn)
            _key_on_mask_and_scalars(op)
            _MINE.add(name)
    rng.install()
    cp_ring.install()
    return [name for name in ops if name in _MINE]


def main(argv: list[str]) -> None:
    """Install the bridges, then run the script argv[0] as `python SCRIPT ARGS` would: as __main__,
    sys.argv = argv, its folder first on sys.path (runpy.run_path). Exits 2 without a script."""
    if not argv:
        print("usage: python -m simcluster.launcher.instrument.bridges SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    install()
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
