"""torch.compile on every rank of a DDP job, its loss beside an eager twin's; a pause outside communication.

    torchrun --nproc-per-node 2 examples/compile.py --steps 3

Two copies of one small MLP (one seed) train side by side under DDP on the same batches, one
optimizer over both: the first compiled with torch.compile (inductor, its default backend), its
twin eager. Rank 0 prints each step's losses (``step N loss L eager E``) and at the end how many
graphs dynamo compiled (``compiled graphs G``). On GPUs (and simcluster's simulated GPUs) the
models live on the rank's cuda device, else on the CPU.
--pause-s S: every rank sleeps S seconds after step 1, outside communication (no hang).
--eager-only: nothing compiled (both copies eager).
"""
import argparse
import copy
import gc
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--pause-s", type=float, default=0.0, help="every rank sleeps this long after step 1")
    p.add_argument("--eager-only", action="store_true", help="compile nothing")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1)).to(device)
    twin = copy.deepcopy(net)
    ids = [local] if cuda else None
    forward = DDP(net if a.eager_only else torch.compile(net), device_ids=ids)  # compiled, then wrapped (nanoGPT's order)
    eager = DDP(twin, device_ids=ids)
    opt = torch.optim.SGD([*net.parameters(), *twin.parameters()], lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(1, a.steps + 1):
        x = torch.randn(32, 16, generator=gen).to(device)
        y = x.sum(1, keepdim=True).tanh()
        opt.zero_grad()
        loss = nn.functional.mse_loss(forward(x), y)
        ref = nn.functional.mse_loss(eager(x), y)
        loss.backward()
        ref.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f} eager {ref.item():.6f}", flush=True)
        if step == 1 and a.pause_s:
            time.sleep(a.pause_s)
    if rank == 0:
        print(f"compiled graphs {counters['stats']['unique_graphs']}", flush=True)
    # Free what holds the process group (each DDP's reducer; dynamo's cache holds the compiled module)
    # before destroying it, as examples/ddp.py does: a reducer freed after destroy_process_group holds
    # the group's last reference and joins gloo's thread while holding the GIL (a hang at exit).
    del forward, eager, opt, net, twin
    torch._dynamo.reset()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
