"""Context parallel attention against one process: torch's context_parallel() on the sequence, plain torchrun.

    torchrun --nproc-per-node 2 examples/context_parallel.py                 # on GPUs
    torchrun --nproc-per-node 2 -m simcluster.launcher.instrument.bridges examples/context_parallel.py OUT.json

No simcluster import: code written for GPUs. Every rank draws the same q, k, v (batch 2, 4 heads,
seq 64, head_dim 16) and a gradient of the output, runs F.scaled_dot_product_attention on the full
sequence (the reference), then again inside torch.distributed.tensor.experimental.context_parallel
over all ranks (the sequence sharded, causal ones load-balanced by torch), backward included, and
unshards output and gradients with context_parallel_unshard. For causal and not, and each of CP's
K/V rotations (allgather, alltoall), it prints and (rank 0) writes to OUT.json the largest
|context parallel - full| of the output and of the gradients of q, k, v. Exits 1 if one is above
1e-5. On CPU, torch 2.13's ring attention handles the CUDA kernels only: run it through
``-m simcluster.launcher.instrument.bridges`` (the CPU op's ring), as above; the cluster's ranks
have it installed.
"""
from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard, set_rotate_method
from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options

SHAPE = (2, 4, 64, 16)  # (batch, heads, seq, head_dim)
TOL = 1e-5


def compare(mesh, causal: bool, rotate: str) -> dict:
    """One attention, full and context parallel: the max abs differences of output, grad q, k, v."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(*SHAPE, requires_grad=True) for _ in range(3))
    grad = torch.randn(*SHAPE)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    full.backward(grad)
    set_rotate_method(rotate)
    _cp_options.enable_load_balance = causal  # torch's load balancing is for causal attention only
    cq, ck, cv, cgrad = (t.detach().clone() for t in (q, k, v, grad))
    with context_parallel(mesh, buffers=[cq, ck, cv, cgrad], buffer_seq_dims=[2] * 4,
                          no_restore_buffers={cq, ck, cv, cgrad}):
        for t in (cq, ck, cv):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=causal)
        out.backward(cgrad)
        got = context_parallel_unshard(mesh, [out.detach(), cq.grad, ck.grad, cv.grad], [2] * 4)
    want = [full.detach(), q.grad, k.grad, v.grad]
    diffs = [(g - w).abs().max().item() for g, w in zip(got, want)]
    return {"causal": causal, "rotate": rotate, "local_seq": out.shape[2],
            "max_abs_diff": dict(zip(("out", "grad_q", "grad_k", "grad_v"), diffs))}


def main(argv: list[str]) -> int:
    """Every case on a 1-D CP mesh of all ranks; rank 0 writes the results to argv[0] if given."""
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        torch.set_default_device(device)
    mesh = init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("cp",))
    results = [compare(mesh, causal, rotate) for causal in (False, True) for rotate in ("allgather", "alltoall")]
    worst = max(d for r in results for d in r["max_abs_diff"].values())
    if dist.get_rank() == 0:
        for r in results:
            print(json.dumps(r))
        print(f"worst max abs diff {worst:.3g} (tolerance {TOL})")
        if argv:
            with open(argv[0], "w") as f:
                json.dump({"world": dist.get_world_size(), "results": results, "worst": worst}, f)
    # Free what holds process groups (the cases' collectives' tensors, then the DeviceMesh) while the
    # interpreter is whole: a gloo worker thread releasing its last collective's tensors needs the GIL,
    # and at interpreter exit that aborted a rank ("terminate called without an active exception";
    # examples/ddp.py, examples/llama_2d.py).
    gc.collect()
    dist.destroy_process_group()
    del mesh
    gc.collect()
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
