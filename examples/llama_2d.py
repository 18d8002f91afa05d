"""A small Llama-style decoder, 2D parallel (FSDP2 over dp x tensor parallel), plain torchrun.

    python examples/llama_2d.py --steps 3                                   # one process: the reference
    torchrun --nproc-per-node 4 examples/llama_2d.py --dp 2 --tp 2 --steps 3       # on GPUs
    torchrun --nproc-per-node 4 -m simcluster.launcher.instrument.bridges examples/llama_2d.py --dp 2 --tp 2
    python -m launcher up --nodes 2 --nproc-per-node 2 --script examples/llama_2d.py --mount DATA_DIR:/data \\
        -- --data /data/tinyshakespeare.txt --steps 3

No simcluster import: code written for GPUs. Blocks of RMSNorm, attention (q, k, v, o
projections, ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``) and a SwiGLU
feed-forward, learned positions (RoPE's plain-tensor tables would need implicit replication
beside DTensors). A (dp, tp) DeviceMesh: tensor parallel inside each block as in PyTorch's TP
tutorial (``ColwiseParallel(use_local_output=False)`` for q, k, v, so the heads view and the
attention work on DTensors sharded over heads; ``RowwiseParallel`` for o; colwise w1, w3 and
rowwise w2 in the feed-forward), FSDP2 ``fully_shard`` over dp. On CPU, SDPA on DTensors needs
the DTensor strategy torch registers for the CUDA kernels only: the simulated cluster installs a
bridge in the ranks (docs/own-code.md, "CPU gaps bridged"); on the host, run through
``-m simcluster.launcher.instrument.bridges`` as above. With --dp 1 --tp 1 the model stays plain.

Data: byte tokens (vocab 256) of --data (else $SIMCLUSTER_DATA, else ../shared/data/tinyshakespeare.txt
beside this repository). Each step draws one global batch of --batch windows of --seq + 1 bytes
from a seeded generator; dp rank d takes rows d*B/dp..(d+1)*B/dp, tp peers the same rows. SGD on
the mean cross-entropy, parameters drawn from one seed before sharding: every (dp, tp) trains the
same model as one process. Mesh: --tp (default LOCAL_WORLD_SIZE: TP inside a node), --dp
(default WORLD_SIZE // tp). Rank 0 prints ``step N/M loss X`` and appends {"step", "loss",
"step_time_s", "total_steps"} to OUT/metrics.jsonl (OUT: --out-dir, else $SIMCLUSTER_OUTPUT_DIR,
else ./out). Every rank prints where it runs.
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
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                    "tinyshakespeare.txt")


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim: (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head self-attention: (batch, seq, dim) -> (batch, seq, dim)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape  # -1: the heads (all of them on a DTensor, this rank's on a local tensor)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, heads, seq, head_dim)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), (batch, seq, dim) -> (batch, seq, dim)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + ffn(norm(x))."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), Attention(dim, heads)
        self.ffn_norm, self.ffn = RMSNorm(dim), FeedForward(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


TP_PLAN = {"attn.wq": ColwiseParallel(use_local_output=False), "attn.wk": ColwiseParallel(use_local_output=False),
           "attn.wv": ColwiseParallel(use_local_output=False), "attn.wo": RowwiseParallel(),
           "ffn.w1": ColwiseParallel(), "ffn.w3": ColwiseParallel(), "ffn.w2": RowwiseParallel()}


def batch(data: torch.Tensor, step: int, size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step, the same on every rank: inputs and next-byte targets (size, seq)."""
    g = torch.Generator().manual_seed(1000 + step)
    starts = torch.randint(0, data.numel() - seq - 1, (size,), generator=g)
    rows = torch.stack([data[s:s + seq + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def main() -> None:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=int(env.get("LOCAL_WORLD_SIZE", 1)))
    p.add_argument("--dp", type=int, default=None, help="default WORLD_SIZE // tp")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--data", default=env.get("SIMCLUSTER_DATA", DATA))
    p.add_argument("--out-dir", default=env.get("SIMCLUSTER_OUTPUT_DIR", "out"))
    args = p.parse_args()
    world = int(env.get("WORLD_SIZE", 1))
    args.dp = world // args.tp if args.dp is None else args.dp
    if args.dp * args.tp != world or args.heads % args.tp or args.dim % args.heads or args.batch % args.dp:
        p.error(f"need dp x tp = WORLD_SIZE ({args.dp} x {args.tp} != {world}), heads % tp = 0, dim % heads = 0 "
                "and batch % dp = 0")
    if not os.path.isfile(args.data):
        p.error(f"no data file {args.data}: pass --data PATH (or set SIMCLUSTER_DATA)")

    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    if device.type != "cpu":
        device = torch.device(device.type, int(env.get("LOCAL_RANK", 0)))
        torch.accelerator.set_device_index(device.index)
    backend = dist.get_default_backend_for_device(device)
    if "RANK" in env:
        dist.init_process_group(backend)
    else:  # one process, no torchrun
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_i = mesh["dp"].get_local_rank()
    print(f"llama_2d rank={rank} host={socket.gethostname()} node={env.get('SIMCLUSTER_NODE', '-')} "
          f"coords=dp{dp_i}/tp{mesh['tp'].get_local_rank()} device={device}", flush=True)
    with open(args.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()

    torch.manual_seed(0)  # every rank draws the full model, then keeps its shards
    model = Llama(256, args.dim, args.layers, args.heads, args.seq).to(device)
    for block in model.blocks:
        if args.tp > 1:
            parallelize_module(block, mesh["tp"], TP_PLAN)
        if args.dp > 1:
            fully_shard(block, mesh=mesh["dp"])
    if args.dp > 1:
        fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    shard = args.batch // args.dp
    writer = None
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        writer = open(os.path.join(args.out_dir, "metrics.jsonl"), "w", encoding="utf-8")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = batch(data, step, args.batch, args.seq)
        x, y = x[dp_i * shard:(dp_i + 1) * shard].to(device), y[dp_i * shard:(dp_i + 1) * shard].to(device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()  # FSDP: gradients reduce-scattered, the mean over dp
        opt.step()
        opt.zero_grad()
        mean = loss.detach() / args.dp  # the global-batch loss: the mean of the dp shards' means
        dist.all_reduce(mean, group=mesh["dp"].get_group())
        if writer:
            dt = time.perf_counter() - t0
            writer.write(json.dumps({"step": step, "loss": mean.item(), "step_time_s": dt,
                                     "total_steps": args.steps}) + "\n")
            writer.flush()
            print(f"step {step}/{args.steps} loss {mean.item():.6f} step_time {dt:.3f}s", flush=True)
    dist.destroy_process_group()
    # Free what still holds process groups (the FSDP states and the DeviceMesh) while the interpreter is whole:
    # a gloo worker thread releasing its last collective's tensors needs the GIL, and at interpreter exit
    # that can abort a rank ("terminate called without an active exception"; examples/ddp.py).
    del model, opt, mesh
    gc.collect()


if __name__ == "__main__":
    main()
