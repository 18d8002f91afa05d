"""GPU-only mistakes in one rank of the simulated GPU, each caught as a GPU catches it (run by
tests/test_gpu_mistakes.py in a fresh interpreter with a rank's environment, --check-devices on,
CUDA_VISIBLE_DEVICES=0,1 of a node of 4). Prints one JSON object: mistake -> "Type: first line" (a
scripted call's: its last line, the op's error, then " ... " and the interpreter's first).

    SIMCLUSTER_INSTRUMENT=1 SIMCLUSTER_CHECK_DEVICES=1 CUDA_VISIBLE_DEVICES=0,1 RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 PYTHONPATH=launcher/instrument/boot:. python tests/gpu_mistakes_check.py
"""
import json

import torch
import torch.distributed as dist

out = {}


def err(name, fn):
    try:
        fn()
        out[name] = None
    except Exception as e:  # noqa: BLE001 - the mistake's own error is what is reported
        out[name] = f"{type(e).__name__}: {e}".splitlines()[0]


model = torch.nn.Linear(8, 4).to("cuda")
batch = torch.randn(16, 8)  # made on the CPU: the classic forgotten .to(device)
err("oom", lambda: torch.empty(200 * 2**30, dtype=torch.uint8, device="cuda"))
err("ordinal", lambda: torch.zeros(1, device="cuda:3"))  # a node of 4, CUDA_VISIBLE_DEVICES=0,1: 2 visible
err("visible_count", lambda: (_ for _ in ()).throw(AssertionError(torch.cuda.device_count())))
err("mixed_forward", lambda: model(batch))
err("mixed_add", lambda: torch.ones(4) + model(batch.cuda()))
err("mixed_after_cpu", lambda: model.weight.cpu() @ model.weight.t())
err("moved", lambda: model(batch.to("cuda")).sum().backward())  # no mistake: runs
err("device_of_param", lambda: model(batch.to(model.weight.device)))  # x.device says cpu: never refused
err("scalar", lambda: model.weight * torch.tensor(0.5))  # CUDA takes a 0-dim CPU tensor


def scripted(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # moved inside TorchScript: no mistake
    return x.to("cuda") @ w.t() + x.cuda() @ w.t()


err("scripted_moved", lambda: torch.jit.script(scripted)(batch, model.weight))


def scripted_mixed(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # mixed_forward, scripted
    return torch.nn.functional.linear(x, w, b)


try:  # the interpreter's error: its header and TorchScript's traceback, the op's own error last (as on a GPU)
    torch.jit.script(scripted_mixed)(batch, model.weight, model.bias)
    out["scripted_mixed"] = None
except RuntimeError as e:
    said = str(e).strip().splitlines()
    out["scripted_mixed"] = f"{said[-1]} ... {said[0]}"
dist.init_process_group("nccl", world_size=1, rank=0)
err("nccl_cpu", lambda: dist.all_reduce(torch.ones(3)))
err("nccl_cuda", lambda: dist.all_reduce(torch.ones(3, device="cuda")))
gloo = dist.new_group([0], backend="gloo")
err("gloo_cpu", lambda: dist.all_reduce(torch.ones(3), group=gloo))  # a gloo group takes CPU tensors
dist.destroy_process_group()
print(json.dumps(out))
