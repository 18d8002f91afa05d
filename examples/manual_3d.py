"""Hand-written 3D-parallel training, plain torchrun: no simcluster import, runs anywhere torchrun does.

    python examples/manual_3d.py --steps 5                                  # one process: the reference
    torchrun --nproc-per-node 8 examples/manual_3d.py --pp 2 --dp 2 --tp 2 --steps 5
    python -m launcher up --mesh 2x2x2 --script examples/manual_3d.py -- --steps 5   # on the simulated cluster

A (pp, dp, tp) DeviceMesh; tensor parallel inside each block (ColwiseParallel up-projection,
RowwiseParallel down-projection, torch.distributed.tensor.parallel); FSDP2 (``fully_shard``)
over dp; and a pipeline written by hand: the stage on pp rank s computes its blocks, sends the
activations (microbatch, dim) to the same (dp, tp) coordinates on pp rank s+1 with
``dist.send`` and receives the gradient of its output back with ``dist.recv`` (GPipe order:
every forward, then every backward). Ranks are laid out pp-outermost (rank = (pp*dp + dp_i)*tp
+ tp_i), so with one node per pipeline stage the send/recv crosses nodes. TP peers get the same
batch shard; the loss is the mean squared error over the global batch, so every mesh trains
the same model as one process (SGD, parameters drawn from one seed before sharding).

Mesh sizes: --pp/--dp/--tp, defaulting to the simulated cluster's SIMCLUSTER_PP/DP/TP, else 1.
Output: every rank prints ``rank=R host=H coords=ppP/dpD/tpT``; rank 0 prints ``step N/M loss X`` and appends {"step", "loss", "step_time_s",
"total_steps"} to OUT/metrics.jsonl (OUT: --out-dir, else $SIMCLUSTER_OUTPUT_DIR, else ./out).
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Block(nn.Module):
    """x + W2 gelu(W1 x): (batch, dim) -> (batch, dim)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def batch(step: int, size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: inputs and targets (size, dim), the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, dim, generator=g)
    return x, torch.sin(x.roll(1, dims=1)) + 0.5 * x


def main() -> None:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pp", type=int, default=int(env.get("SIMCLUSTER_PP", 1)))
    p.add_argument("--dp", type=int, default=int(env.get("SIMCLUSTER_DP", 1)))
    p.add_argument("--tp", type=int, default=int(env.get("SIMCLUSTER_TP", 1)))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=16, help="global batch (samples)")
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--out-dir", default=env.get("SIMCLUSTER_OUTPUT_DIR", "out"))
    args = p.parse_args()

    if "RANK" in env:
        dist.init_process_group("gloo")
    else:  # one process, no torchrun
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (args.pp, args.dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_i, dp_i = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    print(f"rank={rank} host={socket.gethostname()} coords=pp{pp_i}/dp{dp_i}/tp{mesh['tp'].get_local_rank()}",
          flush=True)

    torch.manual_seed(0)  # every rank draws the full model, then keeps its stage and shards
    blocks = [Block(args.dim, 4 * args.dim) for _ in range(args.layers)]
    per_stage = args.layers // args.pp
    stage = nn.Sequential(*blocks[pp_i * per_stage:(pp_i + 1) * per_stage])
    for block in stage:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(stage, mesh=mesh["dp"])
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr)

    stride = args.dp * args.tp  # the same (dp, tp) coordinates one pipeline stage up or down
    prev, nxt = rank - stride, rank + stride
    first, last = pp_i == 0, pp_i == args.pp - 1
    shard = args.batch // args.dp
    mb = shard // args.microbatches
    writer = None
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        writer = open(os.path.join(args.out_dir, "metrics.jsonl"), "w", encoding="utf-8")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = batch(step, args.batch, args.dim)
        x, y = x[dp_i * shard:(dp_i + 1) * shard], y[dp_i * shard:(dp_i + 1) * shard]
        inputs, outputs, loss_sum = [], [], torch.zeros(())
        for m in range(args.microbatches):  # forward of every microbatch
            if first:
                inp = x[m * mb:(m + 1) * mb]
            else:
                inp = torch.empty(mb, args.dim)
                dist.recv(inp, prev)
                inp.requires_grad_()
            out = stage(inp)
            if not last:
                dist.send(out.detach(), nxt)
            inputs.append(inp)
            outputs.append(out)
        for m in reversed(range(args.microbatches)):  # backward, last microbatch first
            if last:
                loss = torch.nn.functional.mse_loss(outputs[m], y[m * mb:(m + 1) * mb]) / args.microbatches
                loss.backward()
                loss_sum += loss.detach()
            else:
                grad = torch.empty(mb, args.dim)
                dist.recv(grad, nxt)
                outputs[m].backward(grad)
            if not first:
                dist.send(inputs[m].grad, prev)
        opt.step()
        opt.zero_grad()
        # the global-batch loss: the last stage's dp means, counted once per tp group
        share = loss_sum / args.dp if last and mesh["tp"].get_local_rank() == 0 else torch.zeros(())
        dist.all_reduce(share)
        if writer:
            dt = time.perf_counter() - t0
            writer.write(json.dumps({"step": step, "loss": share.item(), "step_time_s": dt,
                                     "total_steps": args.steps}) + "\n")
            writer.flush()
            print(f"step {step}/{args.steps} loss {share.item():.6f} step_time {dt:.3f}s", flush=True)
    dist.destroy_process_group()
    # Free what still holds process groups (the FSDP states and the DeviceMesh) while the interpreter is whole: a gloo worker
    # thread releasing its last collective's tensors needs the GIL, and at interpreter exit that
    # can abort a rank ("terminate called without an active exception"; seen 1 run in 5 on 2x2).
    del blocks, stage, opt, mesh
    gc.collect()


if __name__ == "__main__":
    main()
