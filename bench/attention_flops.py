"""What attention adds to the FLOPs of the built-in trainer's presets: torch's bare FlopCounterMode (no
formula for the CPU flash attention op) against the planners' one count, train/plan/flops.py (the CPU
kernel by its CUDA twin's formula, a causal mask halving it).

    python -m bench.attention_flops [--cases small:2:4:256,small:0:8:256,tiny:0:8:256]

Each case MODEL:LAYERS:BATCH:SEQ (LAYERS 0: the preset's own) runs one real forward and backward of
the built-in trainer's model on this CPU under two FlopCounterModes. small:2:4:256 is
train/plan/calibrate.py's block_flops workload (what `local`'s FLOP/s divides by).
"""
from __future__ import annotations

import argparse
import dataclasses


def count(case: str) -> tuple[int, int]:
    """(FLOPs without attention, FLOPs with it) of one forward and backward of ``case``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from simcluster.core.config import PRESETS
    from simcluster.train.model import build_model, loss_fn
    from simcluster.train.plan.flops import counter_mapping

    name, layers, batch, seq = case.split(":")
    args = PRESETS[name] if int(layers) == 0 else dataclasses.replace(PRESETS[name], n_layers=int(layers))
    torch.manual_seed(0)
    model = build_model(args)
    tokens = torch.randint(0, 256, (int(batch), int(seq)))
    out = []
    for mapping in ({}, counter_mapping()):
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            loss_fn(model(tokens), tokens).backward()
        out.append(counter.get_total_flops())
    return out[0], out[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.attention_flops", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="small:2:4:256,small:0:8:256,tiny:0:8:256")
    for case in ap.parse_args(argv).cases.split(","):
        without, with_ = count(case)
        print(f"{case}: {without / 1e9:.3f} GFLOP by the bare counter, {with_ / 1e9:.3f} with attention "
              f"(+{with_ / without - 1:.1%})")


if __name__ == "__main__":
    main()
