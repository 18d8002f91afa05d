"""One rank with a simulated GPU of 1 GiB (--gpu-memory 1GiB): its memory statistics and the verdicts
a GPU gives at its capacity (run by tests/test_gpu_memory.py in a fresh interpreter with a rank's
environment). Prints one JSON object of what it saw.

    SIMCLUSTER_INSTRUMENT=1 RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=2 SIMCLUSTER_GPU_MEMORY=1073741824 PYTHONPATH=launcher/instrument/boot:. python tests/gpu_memory_check.py
"""
import json
import threading

import torch

from simcluster.launcher.instrument.gpu import memory

c = torch.cuda
out = {"kind": memory.KIND, "total": c.get_device_properties(0).total_memory, "info_total": c.mem_get_info()[1]}


def err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return [type(e).__name__, str(e)]
    return None


c.set_device(1)
before = c.memory_allocated()
x = torch.empty(1000, device="cuda")  # 4000 bytes -> 4096 (512-byte blocks)
y = x * 2  # an op's output
out["alloc"] = [c.memory_allocated() - before]
del x, y
out["alloc"].append(c.memory_allocated() - before)
held = []
t = threading.Thread(target=lambda: held.append(torch.ones(256, 1024)))  # 1 MiB made in another thread
t.start()
t.join()
out["thread"] = c.memory_allocated() - before
held.clear()

c.reset_peak_memory_stats()
big = torch.empty(600 * 2**20, dtype=torch.uint8, device="cuda")  # 600 MiB held
out["peak_600"] = c.max_memory_allocated() - before
oom = err(lambda: torch.empty(2**29, dtype=torch.uint8, device="cuda"))  # 512 MiB more: above 1 GiB
out["oom"] = oom
try:
    torch.zeros(2**29, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError:  # a program's OOM handler
    out["handler_ran"] = True
out["num_ooms"] = c.memory_stats()["num_ooms"]
out["nested"] = c.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"] == c.memory_allocated()
out["free_after"] = c.mem_get_info()[0]
del big
out["free_nonnegative"] = min(c.mem_get_info()[0], c.mem_get_info(1)[0]) >= 0

out["fraction_type"] = err(lambda: c.set_per_process_memory_fraction(1))
out["fraction_range"] = err(lambda: c.set_per_process_memory_fraction(1.5))
c.set_per_process_memory_fraction(0.25)
out["fraction"] = c.get_per_process_memory_fraction() if hasattr(c, "get_per_process_memory_fraction") else None
out["fraction_oom"] = err(lambda: torch.empty(300 * 2**20, dtype=torch.uint8, device="cuda"))
c.set_per_process_memory_fraction(1.0)
out["fraction_lifted"] = err(lambda: torch.empty(300 * 2**20, dtype=torch.uint8, device="cuda"))

before = c.memory_allocated()
ptr = c.caching_allocator_alloc(1000)
out["raw"] = [c.memory_allocated() - before]
c.caching_allocator_delete(ptr)
out["raw"].append(c.memory_allocated() - before)
out["history"] = err(lambda: c.memory._record_memory_history(max_entries=1000))
out["history_off"] = err(lambda: c.memory._record_memory_history(enabled=None))
out["snapshot"] = err(lambda: c.memory._snapshot())
print(json.dumps(out))
