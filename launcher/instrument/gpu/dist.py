"""torch.distributed on the simulated GPUs: nccl -> gloo, a "cuda" DeviceMesh on the CPU.

    python -c "from simcluster.launcher.instrument.gpu.dist import backend_of; print(backend_of('cpu:gloo,cuda:nccl'))"

``install_dist`` wraps, in ``torch.distributed``: ``init_process_group`` and ``new_group`` (a
backend naming nccl, alone or as ``cpu:gloo,cuda:nccl``, becomes gloo; ``device_id=`` is accepted
and not bound: the ranks' tensors are CPU tensors), ``barrier(device_ids=...)`` (the ids checked,
then gloo's barrier), ``is_nccl_available`` (True); in ``torch.distributed.device_mesh``:
``DeviceMesh`` and ``init_device_mesh`` given "cuda" build a CPU mesh; ``install_ddp``:
``DistributedDataParallel(module, device_ids=[local_rank], output_device=...)``, the GPU form of
PyTorch's DDP tutorial, checks the ids and wraps the module as DDP wraps a CPU module (no ids: torch
refuses ids for a module whose parameters are on the CPU); ``install_dp``: ``nn.DataParallel`` over
the simulated GPUs runs its module once on the whole batch (the replicas' outputs gathered and their
gradients summed are that run's; BatchNorm's statistics are the whole batch's, as on one device).
NCCL_* variables in the environment are accepted; rank 0 names them once as without effect.

NCCL's duplicate-GPU check: a group the program asked to be nccl binds each rank to one device
(``device_id=``, DDP's ``device_ids``, ``barrier(device_ids=)``, else at its first collective the
device the rank's tensors last named, or the current device); two ranks of a node on one device
raise NCCL's ``Duplicate GPU detected`` DistBackendError, through the job's store.
"""
from __future__ import annotations

import os
import sys

from simcluster.launcher.instrument.gpu.state import STATE


def backend_of(backend):
    """The backend gloo runs for ``backend`` (None, "nccl", "gloo", "cpu:gloo,cuda:nccl", Backend)."""
    if backend is None:
        return None
    text = str(backend).lower()
    if "nccl" not in text:
        return backend
    return "gloo"


_NOTED: list = []  # the note is printed once a process


def _nccl_note() -> None:
    names = sorted(k for k in os.environ if k.startswith("NCCL_"))
    if names and os.environ.get("RANK", "0") == "0" and not _NOTED:
        _NOTED.append(names)
        print(f"[simcluster] {', '.join(names)}: no effect on the simulated GPUs (gloo carries the collectives)",
              file=sys.stderr, flush=True)


NCCL_VERSION = "2.27.5"
DUPLICATE = ("NCCL error in: ProcessGroupNCCL.cpp, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version "
             f"{NCCL_VERSION}\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
             "Duplicate GPU detected : rank {me} and rank {other} both on CUDA device {bus}\n(simcluster: each rank "
             "of a node needs its own GPU: torch.cuda.set_device(local_rank) before the first collective, or "
             "tensors on cuda:local_rank)")
_BOUND: list = []  # this rank's device once bound by an nccl group (checked once)
FIRST = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce",
         "all_to_all_single", "send", "recv", "isend", "irecv", "gather", "scatter")  # a first collective binds


def _step_aside() -> None:
    """The first-collective doors unwrapped once a device is bound or the group is no nccl one (no
    cost per call after; a door another instrument wrapped on top stays, checking a list)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    for mod in (dist, c10d):
        for name in FIRST:
            fn = getattr(mod, name, None)
            if getattr(fn, "__first__", False):
                setattr(mod, name, fn.__simulated__)


def bind_device(index=None) -> None:
    """Bind this rank to one simulated GPU for its nccl groups (once): ``index`` or the device its
    tensors last named; NCCL's duplicate-GPU error when another rank of its node holds that GPU."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    if _BOUND or not STATE.nccl or not dist.is_initialized():
        return
    i = STATE.index(STATE.used if index is None else index)
    physical = STATE.seen[i] if STATE.seen else i
    _BOUND.append(physical)
    _step_aside()
    node, restart = os.environ.get("GROUP_RANK", "0"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key, me = f"simcluster/nccl-gpu/{restart}/{node}/{physical}", str(dist.get_rank())
    holder = c10d._get_default_store().compare_set(key, "", me).decode()
    if holder != me:
        raise dist.DistBackendError(DUPLICATE.format(me=me, other=holder, bus=f"{physical + 1:x}000"))


def install_dist(torch) -> None:
    """Wrap torch.distributed's doors above (idempotent)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def init_pg(fn):
        def wrapper(backend=None, *args, device_id=None, **kwargs):
            if device_id is not None:
                STATE.index(device_id)
            _nccl_note()
            out = fn(backend_of(backend), *args, **kwargs)
            STATE.nccl = STATE.nccl or "nccl" in str(backend or "").lower()
            if not STATE.nccl:
                _step_aside()
            elif device_id is not None:
                bind_device(device_id)
            return out
        return wrapper

    def new_group(fn):
        def wrapper(*args, **kwargs):
            if "backend" in kwargs:
                kwargs["backend"] = backend_of(kwargs["backend"])
            elif len(args) >= 3:
                args = (*args[:2], backend_of(args[2]), *args[3:])
            kwargs.pop("device_id", None)
            return fn(*args, **kwargs)
        return wrapper

    def barrier(fn):
        def wrapper(group=None, async_op=False, device_ids=None, timeout=None):
            for i in device_ids or ():
                STATE.index(i)
            bind_device(device_ids[0] if device_ids else None)
            return fn(group, async_op, timeout=timeout)
        return wrapper

    def first(fn):
        def wrapper(*args, **kwargs):
            if not _BOUND:
                bind_device()
            return fn(*args, **kwargs)
        wrapper.__first__ = True
        return wrapper

    for mod in (dist, c10d):
        _wrap(mod, "init_process_group", init_pg)
        _wrap(mod, "new_group", new_group)
        _wrap(mod, "barrier", barrier)
        _wrap(mod, "is_nccl_available", lambda fn: lambda: True)
        for name in FIRST:
            _wrap(mod, name, first)
    if not hasattr(c10d, "ProcessGroupNCCL"):  # c10d then asks isinstance(backend, ProcessGroupNCCL): never one
        c10d.ProcessGroupNCCL = type("ProcessGroupNCCL", (), {"__doc__": "simulated: no group is NCCL (nccl -> gloo)"})


def install_mesh(torch) -> None:
    """DeviceMesh("cuda", ...) and init_device_mesh("cuda", ...) build a CPU mesh."""
    import torch.distributed.device_mesh as dm
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def cpu(device_type):
        return "cpu" if isinstance(device_type, str) and device_type.startswith("cuda") else device_type

    _wrap(dm.DeviceMesh, "__init__", lambda fn: lambda self, device_type, *a, **k: fn(self, cpu(device_type), *a, **k))
    _wrap(dm, "init_device_mesh", lambda fn: lambda device_type, *a, **k: fn(cpu(device_type), *a, **k))
    import torch.distributed as dist
    if getattr(dist, "init_device_mesh", None) is getattr(dm.init_device_mesh, "__simulated__", None):
        dist.init_device_mesh = dm.init_device_mesh


def install_ddp(parallel) -> None:
    """DistributedDataParallel given ``device_ids``/``output_device`` of the simulated GPUs: the ids
    checked (torch's invalid-ordinal error beyond the node's), then dropped, as a CPU module needs."""
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def init(fn):
        def wrapper(self, module, device_ids=None, output_device=None, *args, **kwargs):
            for i in device_ids or ():
                STATE.index(i)
            if output_device is not None:
                STATE.index(output_device)
            bind_device(device_ids[0] if device_ids else None)
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            if on_cpu:
                device_ids = output_device = None
            return fn(self, module, device_ids, output_device, *args, **kwargs)
        return wrapper

    _wrap(parallel.DistributedDataParallel, "__init__", init)


def install_dp(data_parallel) -> None:
    """``nn.DataParallel`` on the simulated GPUs: its module run once on the whole batch (see above)."""
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def forward(fn):
        def wrapper(self, *inputs, **kwargs):
            return self.module(*inputs, **kwargs)
        return wrapper
    _wrap(data_parallel.DataParallel, "forward", forward)
