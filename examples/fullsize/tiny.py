"""A small FSDP2 training script written for GPUs (cuda, nccl) that `launcher plan --full-size` runs at its size.

    python -m launcher plan --full-size --script examples/fullsize/tiny.py --nodes 1 --nproc-per-node 2 --gpu h100-96g -- --steps 1 --dim 256 --layers 2

Runs as is under torchrun on GPUs: `torchrun --nproc-per-node 2 examples/fullsize/tiny.py --steps 2`.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
p.add_argument("--dim", type=int, default=1024)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--print-loss", action="store_true")
p.add_argument("--save", default=None, metavar="PATH", help="torch.save the model's state dict at the end")
a = p.parse_args()

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
layers = [torch.nn.Sequential(torch.nn.Linear(a.dim, 4 * a.dim), torch.nn.GELU(), torch.nn.Linear(4 * a.dim, a.dim))
          for _ in range(a.layers)]
model = torch.nn.Sequential(*layers).cuda()
for layer in layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(a.steps):
    x = torch.randn(a.batch, a.seq, a.dim, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if a.print_loss:
        print(f"step {step} loss {loss.item():.4f}")
if a.save:
    torch.save(model.state_dict(), a.save)
dist.destroy_process_group()
