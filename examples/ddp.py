"""Plain DistributedDataParallel, plain torchrun: the simplest multi-node job (no pipeline, no TP).

    python examples/ddp.py --steps 5                                         # one process: the reference
    torchrun --nnodes 1 --nproc-per-node 4 examples/ddp.py --steps 5
    python -m launcher up --nodes 2 --nproc-per-node 2 --script examples/ddp.py -- --steps 5

Each rank trains a copy of a small MLP on its shard of the global batch; DDP all-reduces the
gradients (their mean over ranks), so every world size trains the same model as one process.
Rank 0 prints ``step N/M loss X`` (the global-batch mean) and appends {"step", "loss",
"step_time_s", "total_steps"} to OUT/metrics.jsonl (OUT: --out-dir, else
$SIMCLUSTER_OUTPUT_DIR, else ./out). Every rank prints where it runs.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="global batch (samples)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out-dir", default=os.environ.get("SIMCLUSTER_OUTPUT_DIR", "out"))
    args = p.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"ddp rank={rank} local_rank={os.environ.get('LOCAL_RANK', 0)} world_size={world} "
          f"host={socket.gethostname()} node={os.environ.get('SIMCLUSTER_NODE', '-')}", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    shard = args.batch // world
    writer = None
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        writer = open(os.path.join(args.out_dir, "metrics.jsonl"), "w", encoding="utf-8")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(step)
        x = torch.randn(args.batch, 16, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True).sin()
        x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP: gradients all-reduced (mean over ranks)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if writer:
            dt = time.perf_counter() - t0
            writer.write(json.dumps({"step": step, "loss": mean.item(), "step_time_s": dt,
                                     "total_steps": args.steps}) + "\n")
            writer.flush()
            print(f"step {step}/{args.steps} loss {mean.item():.6f} step_time {dt:.3f}s", flush=True)
    # Free what holds the process group (DDP's reducer) while the interpreter is whole, and before
    # destroying the group: a gloo worker thread releasing its last collective's tensors needs the
    # GIL, so at interpreter exit that can abort a rank ("terminate called without an active
    # exception"; seen 1 run in 5 on 2x2), and a reducer freed after destroy_process_group holds
    # the group's last reference and joins that thread while holding the GIL (a hang at exit).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
