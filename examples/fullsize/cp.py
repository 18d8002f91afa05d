"""Context parallel as torch documents it, written for GPUs: a batch of token ids sharded in place by
``context_parallel()``, attention through ``F.scaled_dot_product_attention``, the peak read from
``torch.cuda.memory_stats()`` as torchtitan's memory monitor reads it.

    python -m launcher plan --full-size --script examples/fullsize/cp.py --nodes 1 --nproc-per-node 2 --gpu h100-96g -- --steps 2

Runs as is under torchrun on GPUs: `torchrun --nproc-per-node 2 examples/fullsize/cp.py`. The ids
are made on the host (numpy, as a data loader makes them) and moved to the GPU; context_parallel()
shards them on the sequence (``resize_`` and ``copy_`` of the batch itself) and replaces
``F.scaled_dot_product_attention`` by its ring for the block's duration.
"""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
p.add_argument("--dim", type=int, default=512)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--seq", type=int, default=4096)
p.add_argument("--vocab", type=int, default=1000)
a = p.parse_args()

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
embed = torch.nn.Embedding(a.vocab, a.dim, device="cuda", dtype=torch.bfloat16)
qkv = torch.nn.Linear(a.dim, 3 * a.dim, device="cuda", dtype=torch.bfloat16)
head = torch.nn.Linear(a.dim, a.vocab, device="cuda", dtype=torch.bfloat16)
params = [*embed.parameters(), *qkv.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=1e-3)
rng = np.random.default_rng(0)
for step in range(a.steps):
    ids = rng.integers(0, a.vocab, (1, a.seq + 1))
    tokens, labels = (torch.from_numpy(ids[:, s].copy()).cuda() for s in (slice(0, -1), slice(1, None)))
    with context_parallel(mesh, buffers=[tokens, labels], buffer_seq_dims=[1, 1], no_restore_buffers={tokens, labels}):
        x = embed(tokens)
        q, k, v = (t.view(1, -1, a.heads, a.dim // a.heads).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(1, -1, a.dim)
        loss = F.cross_entropy(head(y).flatten(0, 1).float(), labels.flatten())
        loss.backward()
    opt.step()
    opt.zero_grad()
    peak = torch.cuda.memory_stats()["active_bytes.all.peak"]
    print(f"step {step} tokens {tokens.numel()} peak active {peak / 2**20:.1f} MiB")
dist.destroy_process_group()
