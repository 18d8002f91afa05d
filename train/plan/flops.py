"""FLOPs of one aten op, the one count every planner uses: torch.utils.flop_counter's formulas, with
the CPU flash attention kernels counted by their CUDA twins' formulas and a causal mask halving the work.

    python -c "from simcluster.train.plan.flops import counter_mapping; print(sorted(str(k) for k in counter_mapping()))"

torch 2.13's flop_registry has formulas for the CUDA attention kernels (flash, efficient, cuDNN) but
none for ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, which SDPA runs on the
CPU: a FlopCounterMode on this machine leaves attention out (9% of the small preset's FLOPs, 44% of the
tiny one's at 256 tokens: ``python -m bench.attention_flops``). The CPU kernels take the same tensors,
so the CUDA formula applies unchanged (ALIAS). torch's formulas count the whole score matrix; a causal
kernel computes about half of it (FlashAttention skips the masked blocks), so a causal call counts
half (CAUSAL_ARG: the position of the ``is_causal`` argument, also read as a keyword).

Used by: shapes.stage_cost and calibrate.block_flops (the analytic plan and `local`'s FLOP/s, through
``counter_mapping``), fullsize/record.py (the full-size recorder, through ``op_flops``) and
bench/attention_flops.py.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten
ALIAS = {aten._scaled_dot_product_flash_attention_for_cpu: aten._scaled_dot_product_flash_attention,
         aten._scaled_dot_product_flash_attention_for_cpu_backward: aten._scaled_dot_product_flash_attention_backward}
CAUSAL_ARG = {aten._scaled_dot_product_flash_attention_for_cpu: 4,
              aten._scaled_dot_product_flash_attention_for_cpu_backward: 7,
              aten._scaled_dot_product_flash_attention: 4,
              aten._scaled_dot_product_efficient_attention: 6,
              aten._scaled_dot_product_flash_attention_backward: 11}


def op_flops(packet, args: tuple, kwargs: dict, out) -> int:
    """FLOPs of one call of the op ``packet`` (an OpOverloadPacket) on ``args``/``kwargs`` (tensors, fake
    or real; a DTensor's local tensor for the rank's share) giving ``out``; 0 for an op torch has no
    formula for (elementwise ops, copies: the planners time those by their bytes)."""
    formula = flop_registry.get(ALIAS.get(packet, packet))
    if formula is None:
        return 0
    flops = formula(*args, **kwargs, out_val=out)
    at = CAUSAL_ARG.get(packet)
    if at is not None and (kwargs.get("is_causal") or (len(args) > at and args[at] is True)):
        flops //= 2
    return int(flops)


def counter_mapping() -> dict:
    """``FlopCounterMode(custom_mapping=...)`` that makes torch's counter count as op_flops does: the CPU
    attention kernels added, every attention kernel halved when causal."""
    def raw(packet):
        def flops(*args, out_val=None, **kwargs):
            return op_flops(packet, args, kwargs, out_val)
        flops._get_raw = True  # FlopCounterMode hands the tensors, not their shapes
        return flops

    return {packet: raw(packet) for packet in (*ALIAS, *CAUSAL_ARG) if ALIAS.get(packet, packet) in flop_registry}
