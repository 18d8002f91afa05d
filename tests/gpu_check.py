"""One rank with a simulated GPU answers every question of issue 49 item 1, 2 and 4 (run by
tests/test_simulated_gpus.py in a fresh interpreter with the rank's environment: LOCAL_WORLD_SIZE=4,
--gpu a100-80g). Prints one JSON object of what it saw.

    SIMCLUSTER_INSTRUMENT=1 RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=4 SIMCLUSTER_GPU=a100-80g MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 NCCL_DEBUG=INFO PYTHONPATH=launcher/instrument/boot:. python tests/gpu_check.py
"""
import io
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

out = {}


def err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


c = torch.cuda
out["available"], out["count"], out["initial_seed"] = c.is_available(), c.device_count(), c.initial_seed()
c.set_device(2)
out["current"], out["accelerator"] = c.current_device(), str(torch.accelerator.current_accelerator())
out["acc_index"], out["acc_count"] = torch.accelerator.current_device_index(), torch.accelerator.device_count()
p = c.get_device_properties(0)
out["props"] = [p.name, p.total_memory, p.major, p.minor, p.multi_processor_count, c.get_device_name(),
                list(c.get_device_capability()), list(c.mem_get_info())]
devs = [torch.zeros(2, device="cuda").device, torch.ones(2, device="cuda:1").device,
        torch.randn(2, device=torch.device("cuda", 3)).device, torch.zeros(2).cuda().device,
        torch.zeros(2).to("cuda", non_blocking=True).device, torch.zeros(2).to(1).device,
        torch.nn.Linear(2, 2).cuda().weight.device, torch.nn.Linear(2, 2).to("cuda:0").weight.device,
        torch.zeros(2).pin_memory().device, torch.zeros_like(torch.ones(2), device="cuda").device,
        torch.ones(2).new_zeros(3, device="cuda").device]
with torch.device("cuda"):
    devs.append(torch.empty(1).device)
buf = io.BytesIO()
torch.save({"w": torch.arange(3.0)}, buf)
buf.seek(0)
devs.append(torch.load(buf, map_location="cuda:1")["w"].device)
out["devices"] = sorted({str(d) for d in devs})
out["bad_ordinal"] = err(lambda: torch.zeros(1, device="cuda:5"))
out["bad_set_device"] = err(lambda: c.set_device(4))

before = c.memory_allocated()
x = torch.empty(1000, device="cuda")  # 4000 bytes -> 4096 (512-byte blocks)
out["alloc_delta"] = c.memory_allocated() - before
peak = c.max_memory_allocated()
del x
out["freed_delta"], out["peak_kept"] = c.memory_allocated() - before, c.max_memory_allocated() == peak
c.reset_peak_memory_stats()
out["peak_after_reset"] = c.max_memory_allocated() == c.memory_allocated()
out["stats_keys"] = all(k in c.memory_stats() for k in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                                                         "reserved_bytes.all.current"))
out["reserved_ge"] = c.memory_reserved() >= c.memory_allocated()

a, b = c.Event(enable_timing=True), c.Event(enable_timing=True)
s = c.Stream()
with c.stream(s):
    a.record()
    torch.randn(300, 300, device="cuda") @ torch.randn(300, 300, device="cuda")
    b.record()
c.synchronize()
c.current_stream().wait_stream(s)
out["elapsed_ms_positive"], c_empty = b.elapsed_time(a) <= 0 < a.elapsed_time(b), c.empty_cache()
c.manual_seed(7)
r1 = torch.rand(3, device="cuda")
c.manual_seed_all(7)
out["cuda_seed_repeats"] = torch.equal(r1, torch.rand(3, device="cuda"))
state = c.get_rng_state()
r2 = torch.rand(2, device="cuda")
c.set_rng_state(state)
out["cuda_state_restores"] = torch.equal(r2, torch.rand(2, device="cuda"))
with torch.amp.autocast("cuda", dtype=torch.bfloat16):
    out["autocast_dtype"] = str(torch.nn.Linear(4, 4).cuda()(torch.randn(2, 4, device="cuda")).dtype)
scaler = torch.amp.GradScaler("cuda")
w = torch.nn.Parameter(torch.ones(2, device="cuda"))
opt = torch.optim.SGD([w], lr=0.1)
scaler.scale((w * 2).sum()).backward()
scaler.step(opt)
scaler.update()
out["scaler_step"] = w.detach().tolist()

dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", 2))
dist.destroy_process_group()
dist.init_process_group("nccl", device_id=2)  # NCCL_* named once a process, not once a group
out["backend"] = dist.get_backend()
g = dist.new_group([0], backend="nccl")
t = torch.ones(2, device="cuda")
dist.all_reduce(t, group=g)
dist.barrier(device_ids=[c.current_device()])
mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp",))
out["mesh"] = mesh.device_type
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).cuda(), device_ids=[c.current_device()],
                                                output_device=c.current_device())  # the DDP tutorial's GPU form
ddp(torch.ones(3, 2, device="cuda")).sum().backward()
out["ddp"] = [str(ddp.module.weight.grad.device), ddp.device_ids]
out["ddp_bad_id"] = err(lambda: torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).cuda(), device_ids=[7]))
dist.destroy_process_group()

out["graph"] = err(lambda: torch.cuda.CUDAGraph())
out["scaled_mm"] = err(lambda: torch._scaled_mm(torch.ones(16, 16), torch.ones(16, 16), torch.ones(()), torch.ones(())))
from flash_attn import flash_attn_func  # noqa: E402 - the stand-in of a CUDA-only package
import flash_attn.layers.rotary  # noqa: E402,F401
out["flash"] = err(lambda: flash_attn_func(torch.ones(1), torch.ones(1), torch.ones(1), causal=True))
if len(sys.argv) > 1:  # a folder holding the test's own minimal triton (torch is done looking for one by now)
    sys.path.append(sys.argv[1])
    from triton.runtime.jit import JITFunction

    def add_kernel(x):
        return x

    out["triton"] = err(lambda: JITFunction(add_kernel).run(torch.ones(2, device="cuda"), grid=(1,)))
json.dump(out, sys.stdout)
