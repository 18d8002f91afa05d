"""Install the simulated GPU in one rank of the user's code (called by instrument/rank.py once
torch is imported).

    python -c "from simcluster.launcher.instrument.gpu.install import SUMMARY; print(SUMMARY)"
    SIMCLUSTER_INSTRUMENT=1 RANK=0 LOCAL_WORLD_SIZE=4 PYTHONPATH=launcher/instrument/boot:. python3 tests/gpu_check.py  # a rank's answers

The pieces: gpu/device.py (torch.cuda, torch.accelerator, properties, RNG), gpu/tensors.py
(cuda -> cpu at every tensor door), gpu/dist.py (nccl -> gloo, the "cuda" DeviceMesh, DDP's device_ids),
gpu/memory.py (memory statistics from the rank's tensors, counted by the compiled allocator
gpu/counting_allocator.cpp that gpu/native.py loads; the per-op fallback gpu/tracker.py), gpu/kernels.py (CUDA kernels refused,
the flash-attn stand-in). See docs/own-code.md, "Simulated GPUs".
"""
from __future__ import annotations

import dataclasses
import sys

SUMMARY = "cuda -> cpu, nccl -> gloo"  # what the summary's "simulated GPUs" row says is mapped


def install(torch, count: int, gpu: str, gpu_memory: int | None = None, check_devices: bool = False) -> None:
    """Make this process's torch answer as ``count`` GPUs of model ``gpu`` (a planner hardware name)
    whose tensors live on the CPU; ``gpu_memory``: the device's capacity in bytes (None: the model's);
    ``check_devices``: mixed devices and nccl on CPU tensors refused (gpu/devcheck.py, --check-devices)."""
    from simcluster.launcher.instrument.gpu import memory
    from simcluster.launcher.instrument.gpu.coverage import install_refusals
    from simcluster.launcher.instrument.gpu.device import install_device
    from simcluster.launcher.instrument.gpu.dist import install_ddp, install_dist, install_dp, install_mesh
    from simcluster.launcher.instrument.gpu.kernels import install_kernels, install_standins
    from simcluster.launcher.instrument.gpu.script import (install_script_factories, install_script_moves,
                                                            install_script_ops)
    from simcluster.launcher.instrument.gpu.state import STATE
    from simcluster.launcher.instrument.gpu.tensors import install_tensors
    from simcluster.launcher.instrument.lazy import when_imported

    install_refusals()
    install_device(torch, count, 0, gpu)
    install_tensors(torch)
    install_script_ops(torch)
    install_script_factories(torch)
    install_script_moves(torch)
    install_kernels(torch)
    install_standins()
    when_imported("torch.distributed.distributed_c10d", lambda _m: install_dist(torch))
    when_imported("torch.distributed.device_mesh", lambda _m: install_mesh(torch))
    when_imported("torch.nn.parallel.distributed", install_ddp)
    when_imported("torch.nn.parallel.data_parallel", install_dp)
    if gpu_memory:
        STATE.model = dataclasses.replace(STATE.model, total_memory=int(gpu_memory))
    memory.start(STATE.model.total_memory)
    if check_devices:
        if memory.KIND != "allocator":  # the simulated GPU runs on, unchecked, and the rank says so
            print("[simcluster] --check-devices not installed: it needs the simulated GPU's compiled allocator (its "
                  "marks), which could not be loaded; build it (python -m simcluster.launcher.instrument.gpu.native "
                  "--build) or drop --check-devices", file=sys.stderr, flush=True)
            return
        from simcluster.launcher.instrument.gpu.devcheck import install as check
        from simcluster.launcher.instrument.gpu.script import install_script_errors
        check(torch, memory.COUNTER)
        install_script_errors(torch)  # its refusals' text inside scripted code
