"""Three bugs that only a multi-node layout shows, each behind --bug; the layout sweep's example.

    torchrun --nproc-per-node 2 examples/bugs/layout_bugs.py --bug local-rank-stage --steps 3   # one node: right
    python -m launcher sweep --script examples/bugs/layout_bugs.py --nodes 2 --nproc-per-node 1 -- --bug local-rank-stage
    python -m launcher sweep --script examples/bugs/layout_bugs.py --nodes 2 --nproc-per-node 2 -- --bug per-node-data
    python -m launcher sweep --script examples/bugs/layout_bugs.py --nodes 2 --nproc-per-node 2 -- --bug node-local-file

Plain torchrun, no simcluster import. A pipeline of --pp stages by --dp data-parallel replicas,
written by hand: rank = stage * dp + replica (pp outermost, as ``init_device_mesh`` lays out
(pp, dp)); a stack of residual MLP blocks drawn whole from one seed, each stage keeping its
contiguous share (``stage_range``); one microbatch a step sent forward to rank + dp and its
gradient back to rank - dp (``dist.send``/``dist.recv``); gradients averaged over the stage's
replicas (``all_reduce`` in the stage's dp group); SGD. Each replica takes its shard of the
global batch; the last stage's loss (MSE), all-reduced over the world, is the global batch's.

With --bug none every node layout of the same ranks gives the same loss at every step. Each bug
gives the same loss as none on one node holding every rank, and another on several nodes:

- local-rank-stage: the stage's blocks are picked by LOCAL_RANK // dp, the index on the node, as
  the pipelining tutorial's ``stage_index = LOCAL_RANK``; the fix is RANK // dp. With one stage a
  node every rank holds the first stage's blocks: the loss differs from step 1.
- per-node-data: a replica's data shard is LOCAL_RANK % dp, so on nodes of fewer ranks than dp
  replicas read the same shard (the fix: RANK % dp); the loss differs from step 1.
- node-local-file: rank 0 writes the initial weights to the system's temporary folder (/tmp: each
  node's own) and every rank reads them there; on other nodes the file is missing (the fix: a
  folder every node shares, such as the run folder $SIMCLUSTER_OUTPUT_DIR).

Mesh sizes: --pp (default SIMCLUSTER_PP, else WORLD_SIZE / dp) and --dp (default SIMCLUSTER_DP,
else 1). Output: rank 0 prints ``step N/M loss X`` and appends {"step", "loss", "total_steps"} to
OUT/metrics.jsonl (OUT: --out-dir, else $SIMCLUSTER_OUTPUT_DIR, else ./out).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn

BUGS = ("none", "local-rank-stage", "per-node-data", "node-local-file")


class Block(nn.Module):
    """x + W2 gelu(W1 x): (batch, dim) -> (batch, dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def stage_range(layers: int, stages: int, stage: int) -> range:
    """The blocks of one stage: contiguous, the first layers % stages stages one longer."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


def batch(step: int, size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step, (size, dim) inputs and targets, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, dim, generator=g)
    return x, torch.sin(x.roll(1, dims=1)) + 0.5 * x


def main() -> None:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bug", choices=BUGS, default="none")
    p.add_argument("--pp", type=int, default=int(env["SIMCLUSTER_PP"]) if "SIMCLUSTER_PP" in env else None)
    p.add_argument("--dp", type=int, default=int(env.get("SIMCLUSTER_DP", 1)))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="global batch (samples)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out-dir", default=env.get("SIMCLUSTER_OUTPUT_DIR", "out"))
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = args.dp
    pp = args.pp or world // dp
    if pp * dp != world or args.batch % dp or not 0 < pp <= args.layers:
        p.error(f"need pp x dp = world size ({world}), pp <= layers and the batch divisible by dp; got pp {pp}, dp {dp}")
    stage, replica = divmod(rank, dp)
    local = int(env["LOCAL_RANK"])
    owned = stage_range(args.layers, pp, local // dp if args.bug == "local-rank-stage" else stage)
    shard_of = local % dp if args.bug == "per-node-data" else replica

    torch.manual_seed(0)  # every rank draws the whole model, then keeps its stage's blocks
    blocks = nn.ModuleList(Block(args.dim) for _ in range(args.layers))
    if args.bug == "node-local-file":  # rank 0's copy, through a folder each node has its own of
        path = os.path.join(tempfile.gettempdir(), f"layout-bugs-init-{env.get('TORCHELASTIC_RUN_ID', 'run')}.pt")
        if rank == 0:
            torch.save(blocks.state_dict(), path)
        dist.barrier()
        blocks.load_state_dict(torch.load(path))
    model = nn.Sequential(*(blocks[i] for i in owned))
    groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(pp)]  # every rank makes every group
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    shard = args.batch // dp
    writer = None
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        writer = open(os.path.join(args.out_dir, "metrics.jsonl"), "w", encoding="utf-8")
    for step in range(1, args.steps + 1):
        x, y = batch(step, args.batch, args.dim)
        x, y = x[shard_of * shard:(shard_of + 1) * shard], y[shard_of * shard:(shard_of + 1) * shard]
        if stage > 0:
            x = torch.empty(shard, args.dim)
            dist.recv(x, src=rank - dp)
            x.requires_grad_()
        out = model(x)
        loss = torch.zeros(())
        if stage < pp - 1:
            dist.send(out.detach(), dst=rank + dp)
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + dp)
            out.backward(grad)
        else:
            loss = torch.nn.functional.mse_loss(out, y)
            loss.backward()
        if stage > 0:
            dist.send(x.grad, dst=rank - dp)
        for param in model.parameters():
            dist.all_reduce(param.grad, group=groups[stage])
            param.grad /= dp
        opt.step()
        opt.zero_grad()
        total = loss.detach() / dp
        dist.all_reduce(total)
        if writer:
            writer.write(json.dumps({"step": step, "loss": total.item(), "total_steps": args.steps}) + "\n")
            writer.flush()
            print(f"step {step}/{args.steps} loss {total.item():.6f}", flush=True)
    if writer:
        writer.close()
    dist.destroy_process_group()
    del model, blocks, opt, groups  # free what holds process groups while the interpreter is whole (examples/ddp.py)
    gc.collect()


if __name__ == "__main__":
    main()
