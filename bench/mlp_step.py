"""The small-op step of issue 53: an 8-layer, 64-wide MLP trained on each rank's own GPU, no
collective per step, so a step is nothing but small ops (bench/gpu_memory.py --cluster runs it on 1
node x 2 ranks with the simulated GPU and with --no-simulated-gpus; the cluster's step clock times
each optimizer step).

    torchrun --nproc-per-node 2 bench/mlp_step.py --steps 300
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    layers = [m for _ in range(args.layers) for m in (torch.nn.Linear(args.width, args.width), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=device)
    for _ in range(args.steps):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    total = loss.detach().reshape(1)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(f"loss {total.item() / dist.get_world_size():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
