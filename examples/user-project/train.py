"""A small FSDP2 x tensor-parallel language model, plain torchrun: the example user project's training code.

    torchrun --nproc-per-node 4 train.py --tp 2 --steps 20             # anywhere torchrun runs (GPUs: --device cuda)
    simcluster up --nodes 2 --nproc-per-node 2 --script train.py -- --tp 2 --steps 20   # the simulated cluster
    python -m pytest -n 2 tests                                         # its tests, through the simcluster plugin

The ranks form a 2D DeviceMesh (dp, tp) = (world_size / tp, tp), tp innermost, so tensor-parallel
peers share a node. Each block's MLP is split with ColwiseParallel / RowwiseParallel
(torch.distributed.tensor.parallel), then every block and the model are sharded over dp with
FSDP2 (``fully_shard``): the torchtitan recipe. --tp defaults to $SIMCLUSTER_TP on the cluster's
meshes, else 1; it must divide the world size (else every rank raises ValueError).

Data: a synthetic language (token t is followed by (t * 3 + 1) mod vocab), batches drawn from one
seed per step, the global batch split over dp: every layout trains the same model on the same
data, so its losses match one process. Loss: next-token cross-entropy; AdamW.
Output folder OUT: $SIMCLUSTER_OUTPUT_DIR (the run folder on the cluster), else --out. Rank 0
prints ``step N/M loss X`` and appends {"step", "loss"} to OUT/metrics.jsonl. With --ckpt-every K
it saves model and optimizer every K steps with torch.distributed.checkpoint (DCP) into
OUT/ckpt/step-N and names the newest complete one in OUT/ckpt/latest; a start finds it and
resumes there (``resumed from step N``), on any layout.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Block(nn.Module):
    """x + W2 gelu(W1 norm(x)): (batch, seq, dim) -> (batch, seq, dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class LM(nn.Module):
    """tokens (batch, seq) -> logits (batch * seq, vocab)."""

    def __init__(self, vocab: int, dim: int, n_layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(0, 1))  # 2D: FSDP2 warns of an output that is a view


def batch(step: int, size: int, seq: int, vocab: int) -> torch.Tensor:
    """The global batch of a step (size, seq + 1): random first tokens, then t -> (3t + 1) % vocab."""
    g = torch.Generator().manual_seed(step)
    tokens = [torch.randint(0, vocab, (size,), generator=g)]
    for _ in range(seq):
        tokens.append((tokens[-1] * 3 + 1) % vocab)
    return torch.stack(tokens, dim=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tp", type=int, default=int(os.environ.get("SIMCLUSTER_TP", 1)))
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-every", type=int, default=0, metavar="K", help="save every K steps (0: never)")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    p.add_argument("--out", default="out")
    args = p.parse_args()

    if args.device == "cuda":  # this rank's GPU, bound to the group: NCCL's barrier then knows its device
        gpu = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(gpu)
        dist.init_process_group("nccl", device_id=gpu)
    else:
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if args.tp < 1 or world % args.tp:
        raise ValueError(f"--tp {args.tp} does not divide world size {world}; pick a divisor, e.g. --tp 1")
    mesh = init_device_mesh(args.device, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    if args.batch % dp:
        raise ValueError(f"--batch {args.batch} does not split over dp {dp}; pick a multiple of {dp}")

    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    model = LM(args.vocab, args.dim, args.layers).to(args.device)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)

    out = os.environ.get("SIMCLUSTER_OUTPUT_DIR") or args.out
    ckpt = os.path.join(out, "ckpt")
    start = 0
    if os.path.isfile(os.path.join(ckpt, "latest")):
        with open(os.path.join(ckpt, "latest")) as fh:
            start = int(fh.read())
        state = dict(zip(("model", "optim"), get_state_dict(model, optim)))
        dcp.load(state, checkpoint_id=os.path.join(ckpt, f"step-{start}"))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if rank == 0:
            print(f"resumed from step {start}", flush=True)

    local = args.batch // dp
    for step in range(start + 1, args.steps + 1):
        tokens = batch(step, args.batch, args.seq, args.vocab)[dp_rank * local:(dp_rank + 1) * local].to(args.device)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits, tokens[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
        total = loss.detach().clone()
        dist.all_reduce(total, group=mesh["dp"].get_group())  # the global batch's loss: the mean over dp
        value = total.item() / dp
        if rank == 0:
            print(f"step {step}/{args.steps} loss {value:.6f}", flush=True)
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "metrics.jsonl"), "a") as fh:
                fh.write(json.dumps({"step": step, "loss": value}) + "\n")
        if args.ckpt_every and step % args.ckpt_every == 0:
            state = dict(zip(("model", "optim"), get_state_dict(model, optim)))
            dcp.save(state, checkpoint_id=os.path.join(ckpt, f"step-{step}"))
            dist.barrier()
            if rank == 0:  # the newest complete checkpoint, named once every rank has written its part
                with open(os.path.join(ckpt, "latest.tmp"), "w") as fh:
                    fh.write(str(step))
                os.replace(os.path.join(ckpt, "latest.tmp"), os.path.join(ckpt, "latest"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
