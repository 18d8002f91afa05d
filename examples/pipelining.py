"""3D-parallel training with torch's own pipelining, plain torchrun: no simcluster import.

    python examples/pipelining.py --steps 5                                 # one process: the reference
    torchrun --nproc-per-node 8 examples/pipelining.py --pp 2 --dp 2 --tp 2 --steps 5
    torchrun --nproc-per-node 8 examples/pipelining.py --pp 2 --dp 2 --tp 2 --schedule 1f1b --steps 5
    python -m launcher up --mesh 2x2x2 --script examples/pipelining.py -- --steps 5   # on the simulated cluster

The same model and parallelism as examples/manual_3d.py, with the hand-written send/recv
pipeline replaced by ``torch.distributed.pipelining``: a (pp, dp, tp) DeviceMesh, ranks laid out
pp-outermost as ``init_device_mesh`` does (rank = (pp*dp + dp_i)*tp + tp_i); a stack of residual
MLP blocks that every rank draws whole from one seed before keeping its stage's blocks
(``stage_range``, a pure function of layers, stages and stage index); tensor parallel inside each
block (``ColwiseParallel`` up-projection, ``RowwiseParallel`` down-projection); FSDP2
``fully_shard`` over dp; and ``PipelineStage(stage, pp_i, pp, device, group=mesh["pp"].get_group())``
driven by ``ScheduleGPipe`` (--schedule gpipe, the default) or ``Schedule1F1B`` (--schedule 1f1b;
it needs --microbatches >= --pp). The schedule splits each rank's dp shard of the global batch
into --microbatches microbatches; between stages it sends activations of shape
(microbatch, dim) = (batch / dp / microbatches, dim) forward and their gradients, the same shape,
backward, to the same (dp, tp) coordinates on the next/previous pp rank (with one node per
stage, across nodes). The RowwiseParallel output is a plain replicated tensor, so no DTensor
crosses a stage boundary. The loss is the mean squared error on the last stage (the schedule's
``loss_fn``); the schedule divides the gradients by the number of microbatches and FSDP averages
them over dp, so every mesh trains the same model as one process (SGD); the loss equals one
process's within 1e-5 relative at every step.

On CPU/gloo the pipelining API needs nothing a GPU would not, except the device:
``torch.device("cpu")`` (on GPUs ``torch.device("cuda", local_rank)``); gloo carries the
stages' send/recv. The stage is built in static mode: ``input_args``/``output_args`` are meta
tensors of shape (microbatch, dim), so the first step skips the runtime shape inference (one
extra forward and backward plus metadata messages). Their ``requires_grad`` is not decoration:
it says which way gradients flow. A stage whose output example lacks it is given no gradient
buffer, and its backward fails ("grad can be implicitly created only for scalar outputs", the
output gradient None); a later stage's input example needs it to send its gradient back; the
first stage's input (the data) needs none. ``schedule.step()``
returns the merged outputs on the last stage and None elsewhere; the per-microbatch losses
(unscaled means, one per microbatch) come back only through its ``losses=`` list, filled on the
last stage, so the loss to report is the mean of that list.

Mesh sizes: --pp/--dp/--tp, defaulting to the simulated cluster's SIMCLUSTER_PP/DP/TP, else 1.
Output: every rank prints ``rank=R host=H coords=ppP/dpD/tpT``; rank 0 prints ``step N/M loss X``
(the global-batch loss: the last stage's losses all-reduced over the world) and appends {"step",
"loss", "step_time_s", "total_steps"} to OUT/metrics.jsonl (OUT: --out-dir, else
$SIMCLUSTER_OUTPUT_DIR, else ./out).
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
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class Block(nn.Module):
    """x + W2 gelu(W1 x): (batch, dim) -> (batch, dim)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def stage_range(layers: int, stages: int, stage: int) -> range:
    """The blocks of one pipeline stage: contiguous, the first layers % stages stages one longer."""
    if not 0 < stages <= layers:
        raise ValueError(f"need 1 <= stages <= layers, got {stages} stages for {layers} layers")
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


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
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=16, help="global batch (samples)")
    p.add_argument("--microbatches", type=int, default=2, help="per dp shard, per step")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--out-dir", default=env.get("SIMCLUSTER_OUTPUT_DIR", "out"))
    args = p.parse_args()
    if args.batch % (args.dp * args.microbatches):
        p.error(f"--batch {args.batch} must divide by dp x microbatches = {args.dp * args.microbatches}")
    if args.schedule == "1f1b" and args.microbatches < args.pp:
        p.error(f"--schedule 1f1b needs --microbatches >= --pp ({args.pp})")

    if "RANK" in env:
        dist.init_process_group("gloo")
    else:  # one process, no torchrun
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    device = torch.device("cpu")  # on GPUs: torch.device("cuda", int(env["LOCAL_RANK"]))
    mesh = init_device_mesh("cpu", (args.pp, args.dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_i, dp_i, tp_i = (mesh[d].get_local_rank() for d in ("pp", "dp", "tp"))
    print(f"rank={rank} host={socket.gethostname()} coords=pp{pp_i}/dp{dp_i}/tp{tp_i}", flush=True)

    torch.manual_seed(0)  # every rank draws the full model, then keeps its stage and shards
    blocks = [Block(args.dim, 4 * args.dim) for _ in range(args.layers)]
    stage_mod = nn.Sequential(*(blocks[i] for i in stage_range(args.layers, args.pp, pp_i)))
    for block in stage_mod:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(stage_mod, mesh=mesh["dp"])
    opt = torch.optim.SGD(stage_mod.parameters(), lr=args.lr)

    shard = args.batch // args.dp
    mb = shard // args.microbatches
    first, last = pp_i == 0, pp_i == args.pp - 1
    # What crosses each stage boundary, (microbatch, dim). In static mode requires_grad says which way
    # gradients flow: an output without it gets no gradient back, an input without it sends none.
    stage = PipelineStage(stage_mod, pp_i, args.pp, device,
                          input_args=torch.empty(mb, args.dim, device="meta", requires_grad=not first),
                          output_args=torch.empty(mb, args.dim, device="meta", requires_grad=True),
                          group=mesh["pp"].get_group())
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=args.microbatches,
                                        loss_fn=torch.nn.functional.mse_loss)
    writer = None
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        writer = open(os.path.join(args.out_dir, "metrics.jsonl"), "w", encoding="utf-8")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = batch(step, args.batch, args.dim)
        x, y = x[dp_i * shard:(dp_i + 1) * shard], y[dp_i * shard:(dp_i + 1) * shard]
        losses: list[torch.Tensor] = []
        inputs = (x,) if first else ()
        schedule.step(*inputs, target=y if last else None, losses=losses if last else None)
        opt.step()
        opt.zero_grad()
        # the global-batch loss: the mean of the last stage's microbatch losses and dp shards, counted once per tp group
        share = torch.zeros(())
        if last and tp_i == 0:
            share = torch.stack([loss.detach() for loss in losses]).mean() / args.dp
        dist.all_reduce(share)
        if writer:
            dt = time.perf_counter() - t0
            writer.write(json.dumps({"step": step, "loss": share.item(), "step_time_s": dt,
                                     "total_steps": args.steps}) + "\n")
            writer.flush()
            print(f"step {step}/{args.steps} loss {share.item():.6f} step_time {dt:.3f}s", flush=True)
    if writer:
        writer.close()
    dist.destroy_process_group()
    # Free what still holds process groups (the schedule and stage, the FSDP states, the DeviceMesh) while the
    # interpreter is whole: a gloo worker thread releasing its last collective's tensors needs the GIL, and at
    # interpreter exit that can abort a rank ("terminate called without an active exception"; see examples/ddp.py).
    del schedule, stage, blocks, stage_mod, opt, mesh
    gc.collect()


if __name__ == "__main__":
    main()
