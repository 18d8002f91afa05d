"""A minimal 4D-style trainer written for GPUs (pp x dp x tp): it runs on the simulated GPUs unchanged.

    torchrun --nproc-per-node 8 examples/gpu/nd_4d.py --pp 2 --dp 2 --tp 2 --steps 3   # on 8 GPUs
    python -m launcher up --nodes 2 --nproc-per-node 4 --script examples/gpu/nd_4d.py -- --pp 2 --dp 2 --tp 2 --steps 3

The way such trainers are written for GPUs: flash-attn imported at the top (a CUDA-only package;
``--attn flash`` uses it, ``--attn sdpa``, the default, torch's SDPA), tensors made with
``device="cuda"``, ``torch.cuda.synchronize()`` around the timed step, a "cuda" DeviceMesh (pp, dp,
tp), tensor parallel inside each block (heads split locally), FSDP2 over dp, and
torch.distributed.pipelining's GPipe schedule over pp (stage s on pp rank s, 2 microbatches).
The last stage prints ``rank R step N loss X`` (its microbatches' mean) on every rank it holds.
Nothing in it knows of simcluster. tests/test_simulated_gpus.py runs it on 2 nodes x 4 ranks and
against its CPU twin (its device lines edited) under plain torchrun: the losses are equal.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from flash_attn import flash_attn_func  # a CUDA-only package: used with --attn flash
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 64, 64, 4, 4, 32, 4


class Block(nn.Module):
    def __init__(self, attn: str):
        super().__init__()
        self.attn = attn
        self.norm1, self.norm2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wqkv = nn.ModuleList(nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.up, self.down = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(self.norm1(x)).view(b, s, -1, DIM // HEADS) for w in self.wqkv)
        if self.attn == "flash":
            a = flash_attn_func(q, k, v, causal=True)
        else:
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        x = x + self.wo(a.reshape(b, s, -1))
        return x + self.down(F.silu(self.up(self.norm2(x))))


class Stage(nn.Module):
    """One pipeline stage: the embedding on the first, the head on the last."""

    def __init__(self, first: bool, last: bool, layers: int, attn: str):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM) if first else None
        self.blocks = nn.ModuleList(Block(attn) for _ in range(layers))
        self.head = nn.Linear(DIM, VOCAB, bias=False) if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--attn", choices=("sdpa", "flash"), default="sdpa")
    args = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    dist.init_process_group(backend="nccl")
    mesh = init_device_mesh("cuda", (args.pp, args.dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp, dp = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()

    per_stage = LAYERS // args.pp
    torch.manual_seed(0)  # every stage's weights from one draw of the whole model, before sharding
    stages = [Stage(s == 0, s == args.pp - 1, per_stage, args.attn) for s in range(args.pp)]
    model = stages[pp].to(device)
    for block in model.blocks:
        plan = {f"wqkv.{i}": ColwiseParallel() for i in range(3)}
        plan.update({"wo": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
        parallelize_module(block, mesh["tp"], plan)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)
    stage = PipelineStage(model, pp, args.pp, device, group=mesh["pp"].get_group())
    loss_fn = lambda logits, y: F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))  # noqa: E731
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    gen = torch.Generator().manual_seed(1000 + dp)  # each dp rank its batch; pp and tp peers the same
    for step in range(1, args.steps + 1):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
        seq = (start.to(device) + torch.arange(SEQ + 1, device="cuda")) % VOCAB  # a learnable pattern (start: CPU)
        seq = seq.to(device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses = []
        if pp == 0:
            schedule.step(seq[:, :-1])
        elif pp == args.pp - 1:
            schedule.step(target=seq[:, 1:], losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if losses:
            loss = torch.stack(losses).mean().item()
            line = f"rank {dist.get_rank()} step {step} loss {loss:.8f} time {time.perf_counter() - t0:.3f}s\n"
            print(line, end="", flush=True)  # one write: lines of ranks sharing a pipe stay whole
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
