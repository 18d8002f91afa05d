"""Lightning Fabric, 2D: tensor parallel x FSDP2 through its own ModelParallelStrategy, a DCP checkpoint
saved to a relative path; what a Lightning user writes for GPUs (accelerator="cuda"), run on the simulated GPUs unchanged.

    python -m launcher up --nodes 2 --nproc-per-node 2 --script examples/frameworks/lightning_2d/train.py \
        --requirements examples/frameworks/lightning_2d/requirements.txt -- --steps 8
    torchrun --nproc-per-node 4 examples/frameworks/lightning_2d/train.py --steps 8    # on 4 GPUs, lightning installed

The mesh is (data_parallel = nodes, tensor_parallel = ranks per node): tensor parallel inside a node,
FSDP2 across nodes, as on GPU nodes. The model is built on the meta device by ``fabric.init_module``,
parallelized by ``parallelize`` (a TP plan dict, then ``fully_shard`` per block), then initialized
by the strategy: random init on DTensors (the CPU bridge gives it the GPU's per-shard draws).
Rank 0 prints ``step N/M loss X``; the checkpoint lands in ``checkpoint/`` of the working
directory, one shard file per rank (on the cluster: RUN_DIR/work/checkpoint).
"""
from __future__ import annotations

import argparse
import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, DIM, LAYERS, SEQ = 64, 64, 2, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """A next-token model of (batch, SEQ) ids -> (batch * SEQ, VOCAB) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(0, 1))  # (batch * SEQ, VOCAB): a new tensor, not a view of one

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)


def parallelize(model: TinyLM, device_mesh) -> TinyLM:
    """TP inside a node (each block's MLP: up column-wise, down row-wise), then FSDP2 over dp."""
    tp, dp = device_mesh["tensor_parallel"], device_mesh["data_parallel"]
    for block in model.blocks:
        parallelize_module(block, tp, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return model


def batch(step: int, size: int) -> torch.Tensor:
    """The same global batch on every rank: counting sequences modulo VOCAB, a pattern to learn."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    return (start + torch.arange(SEQ + 1)) % VOCAB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // nproc
    strategy = ModelParallelStrategy(parallelize_fn=parallelize, data_parallel_size=nodes, tensor_parallel_size=nproc)
    fabric = L.Fabric(accelerator="cuda", devices=nproc, num_nodes=nodes, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0)
    with fabric.init_module(empty_init=True):
        model = TinyLM()
    model = fabric.setup(model)
    opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-3))
    for step in range(1, args.steps + 1):
        ids = batch(step, args.batch).to(fabric.device)
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:].reshape(-1))
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        fabric.print(f"step {step}/{args.steps} loss {loss.item():.4f}")
    fabric.save("checkpoint", {"model": model, "optimizer": opt, "step": args.steps})
    fabric.print("saved checkpoint")


if __name__ == "__main__":
    main()
