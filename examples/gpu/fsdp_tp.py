"""A program written for 4+ GPUs, FSDP2 x tensor parallel: it runs on the simulated GPUs unchanged.

    torchrun --nproc-per-node 4 examples/gpu/fsdp_tp.py --steps 3          # on 4 GPUs (exits 0 on fewer)
    python -m launcher up --nodes 2 --nproc-per-node 4 --script examples/gpu/fsdp_tp.py -- --steps 3

Written the way GPU programs are (the style of PyTorch's FSDP + TP example): it counts the GPUs and
exits 0 when it finds fewer than 4, takes ``cuda:LOCAL_RANK``, starts nccl, builds a "cuda"
DeviceMesh (dp, tp), shards each block's attention and MLP with ColwiseParallel /
RowwiseParallel over tp (the heads split locally), then ``fully_shard`` over dp, trains with AdamW
and prints ``step N loss X`` on every rank. Nothing in it knows of simcluster.
tests/test_simulated_gpus.py runs it on 2 nodes x 4 ranks and against its CPU twin (its device
lines edited) under plain torchrun: the losses are equal.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 64, 4, 2, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(b, s, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # heads local to this tp rank
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(0, 1))  # (batch * seq, vocab)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.device_count() < 4:
        print("Unable to locate sufficient 4 gpus to run this example. Exiting.")
        sys.exit(0)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()

    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    model = Model().to(device)
    for block in model.blocks:
        block.attn_heads = HEADS // args.tp
        parallelize_module(block, mesh["tp"], {"wq": ColwiseParallel(), "wk": ColwiseParallel(),
                                                "wv": ColwiseParallel(), "wo": RowwiseParallel(),
                                                "w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    gen = torch.Generator().manual_seed(100 + dp_rank)  # each dp rank its batch, tp peers the same one
    for step in range(1, args.steps + 1):
        start = torch.randint(0, VOCAB, (4, 1), generator=gen)
        seq = ((start + torch.arange(SEQ + 1)) % VOCAB).to(device, non_blocking=True)  # a learnable pattern
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits, seq[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print(f"rank {dist.get_rank()} step {step} loss {loss.item():.8f}\n", end="", flush=True)  # one write
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
