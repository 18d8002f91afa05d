"""Two ranks of one node on the simulated GPUs under torchrun (run by tests/test_gpu_api.py): with
``set`` each sets its own device before its first nccl collective, with ``unset`` neither does (both on
device 0: NCCL's duplicate-GPU error); ``set`` then runs nn.DataParallel over the node's GPUs against
its module alone. Each rank prints one line.

    SIMCLUSTER_INSTRUMENT=1 PYTHONPATH=launcher/instrument/boot:. torchrun --nproc-per-node 2 tests/gpu_nccl_check.py set
"""
import os
import sys

import torch
import torch.distributed as dist

mode, local_rank = sys.argv[1], int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")
if mode == "set":
    torch.cuda.set_device(local_rank)
t = torch.ones(2, device="cuda")
try:
    dist.all_reduce(t)
    line = f"rank {dist.get_rank()} ok {t.tolist()}"
except dist.DistBackendError as e:
    line = f"rank {dist.get_rank()} error {str(e).splitlines()[-2]}"
if mode == "set":  # nn.DataParallel over the node's GPUs against its module alone
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 1).cuda(), torch.randn(8, 4, device="cuda")
    dp = torch.nn.DataParallel(model)
    dp(x).square().mean().backward()
    grad, model.weight.grad = model.weight.grad.clone(), None
    model(x).square().mean().backward()
    line += f" dp {dp.device_ids} {torch.equal(grad, model.weight.grad)}"
print(line + "\n", end="", flush=True)
dist.destroy_process_group()
