"""How much the analytic planner's FLOP count leaves out: the CPU flash attention op, which torch's
FlopCounterMode has no formula for, counted by the CUDA kernel's formula (as the full-size recorder
counts it, a causal mask halving it), against the count without it, for the built-in trainer's presets.

    python -m bench.attention_flops [--cases small:2:4:256,small:0:8:256,tiny:0:8:256]

Each case MODEL:LAYERS:BATCH:SEQ (LAYERS 0: the preset's own) runs one real forward and backward of
the built-in trainer's model on this CPU under two FlopCounterModes. small:2:4:256 is
train/plan/calibrate.py's block_flops workload (what `local`'s FLOP/s divides by).
"""
from __future__ import annotations

import argparse
import dataclasses


def attention_mapping() -> dict:
    """FlopCounterMode's custom_mapping for the CPU flash attention ops (forward, backward): the CUDA
    flash kernel's formulas of torch.utils.flop_counter on the same tensors, halved when causal."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten

    def formula(cuda_op, causal_at: int):
        def flops(*args, out_val=None, **kwargs):
            n = flop_registry[cuda_op](*args, out_val=out_val, **kwargs)
            causal = kwargs.get("is_causal") or (len(args) > causal_at and args[causal_at] is True)
            return n // 2 if causal else n
        flops._get_raw = True  # FlopCounterMode hands the tensors, not their shapes
        return flops

    return {aten._scaled_dot_product_flash_attention_for_cpu: formula(aten._scaled_dot_product_flash_attention, 4),
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
                formula(aten._scaled_dot_product_flash_attention_backward, 7)}


def count(case: str) -> tuple[int, int]:
    """(FLOPs without attention, FLOPs with it) of one forward and backward of ``case``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from simcluster.core.config import PRESETS
    from simcluster.train.model import build_model, loss_fn

    name, layers, batch, seq = case.split(":")
    args = PRESETS[name] if int(layers) == 0 else dataclasses.replace(PRESETS[name], n_layers=int(layers))
    torch.manual_seed(0)
    model = build_model(args)
    tokens = torch.randint(0, 256, (int(batch), int(seq)))
    out = []
    for mapping in ({}, attention_mapping()):
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            loss_fn(model(tokens), tokens).backward()
        out.append(counter.get_total_flops())
    return out[0], out[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.attention_flops", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="small:2:4:256,small:0:8:256,tiny:0:8:256")
    for case in ap.parse_args(argv).cases.split(","):
        without, with_ = count(case)
        print(f"{case}: {without / 1e9:.3f} GFLOP counted today, {with_ / 1e9:.3f} with attention "
              f"(+{with_ / without - 1:.1%})")


if __name__ == "__main__":
    main()
