"""One rank of the user's program at its real size, nothing computed: the program runs unchanged on
the simulated GPU (cuda -> cpu), inside torch's FakeTensorMode (tensors with shapes, no data) and on
torch's fake process group (collectives dispatched, no bytes moved), under the full-size recorder;
the trace is written as JSON for the planner (train/plan/fullsize/).

    python -m simcluster.launcher.instrument.fullsize --rank 0 --world-size 8 --local-world-size 8 --gpu h100-96g \
        --out /tmp/trace-0.json --script examples/fullsize/tiny.py -- --steps 2

Started by `launcher plan --full-size` (launcher/fullsize.py), one process a distinct rank, with the
environment torchrun gives a rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...). Any backend the
program names (nccl, gloo, cpu:gloo,cuda:nccl) becomes torch's "fake" backend on a FakeStore.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time


def _fake_backend(torch) -> None:
    """init_process_group/new_group: whatever backend named, torch's fake one (a FakeStore for the world)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    orig_init, orig_new = c10d.init_process_group, c10d.new_group

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           group_name="", pg_options=None, device_id=None, **kw):
        world = int(os.environ["WORLD_SIZE"]) if world_size in (-1, None) else world_size
        me = int(os.environ["RANK"]) if rank in (-1, None) else rank
        kwargs = {"timeout": timeout} if timeout is not None else {}
        return orig_init("fake", store=FakeStore(), world_size=world, rank=me, group_name=group_name, **kwargs)

    def new_group(ranks=None, timeout=None, backend=None, *args, **kw):
        kw.pop("device_id", None)
        kw.pop("pg_options", None)
        return orig_new(ranks, timeout, "fake", *args, **kw)

    for mod in (dist, c10d):
        mod.init_process_group, mod.new_group = init_process_group, new_group
        mod.is_nccl_available = lambda: True
    if not hasattr(c10d, "ProcessGroupNCCL"):  # c10d asks isinstance(backend, ProcessGroupNCCL): never one here
        c10d.ProcessGroupNCCL = type("ProcessGroupNCCL", (), {"__doc__": "full-size plan: every group is fake"})


def _same_tensor_swap(torch) -> None:
    """Module.to/.cuda under FakeTensorMode swaps each parameter with a new Parameter even when the
    conversion returned the tensor itself (cuda -> cpu here: the same device), and torch's swap then
    fails on the shared tensor; a swap of a tensor with an alias of itself is made a no-op."""
    import torch.utils
    orig = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        if (isinstance(t1, torch.Tensor) and isinstance(t2, torch.Tensor) and t1.dtype == t2.dtype
                and t1.shape == t2.shape and t1.stride() == t2.stride()
                and t1.untyped_storage()._cdata == t2.untyped_storage()._cdata
                and t1.storage_offset() == t2.storage_offset()):
            return None
        return orig(t1, t2)

    torch.utils.swap_tensors = swap_tensors


def _outside(fn):
    """``fn`` run with the fake mode (and every other dispatch mode) off: its tensors are real."""
    import functools

    from torch.utils._python_dispatch import _disable_current_modes

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _disable_current_modes():
            return fn(*args, **kwargs)
    return wrapper


def _mesh_outside_fake(torch) -> None:
    """DeviceMesh computes its coordinates with tensor ops (``nonzero``) that FakeTensorMode cannot
    answer: every function of the DeviceMesh class, and init_device_mesh, run with the dispatch modes
    (the fake mode and the recorder) set aside; a mesh holds rank numbers only, no device memory."""
    import inspect

    import torch.distributed as dist
    import torch.distributed.device_mesh as dm

    for name, fn in list(vars(dm.DeviceMesh).items()):
        if inspect.isfunction(fn) and (not name.startswith("__") or name in ("__init__", "__getitem__")):
            setattr(dm.DeviceMesh, name, _outside(fn))
        elif isinstance(fn, (staticmethod, classmethod)):
            setattr(dm.DeviceMesh, name, type(fn)(_outside(fn.__func__)))
    wrapped = _outside(dm.init_device_mesh)
    both = (dm.init_device_mesh, getattr(dm.init_device_mesh, "__simulated__", None))
    for mod in list(sys.modules.values()):  # modules that imported the function by name already
        if getattr(mod, "init_device_mesh", None) in both:
            mod.init_device_mesh = wrapped


def _host_data_real(torch) -> None:
    """torch.frombuffer and torch.from_numpy make host tensors of data the program read (a batch's
    bytes): made outside the fake mode, they hold their values (host memory, not the device's)."""
    torch.frombuffer, torch.from_numpy = _outside(torch.frombuffer), _outside(torch.from_numpy)


def _loader_batches_real(torch) -> None:
    """A torch DataLoader's batches are made outside the fake mode, as on a GPU host, where a loader
    reads and indexes real data on the CPU (its sampler's draws, the corpus's bytes): they hold their
    values and become fake tensors where they meet the program's device tensors (the model's door)."""
    import torch.utils.data.dataloader as dl

    for name in ("__init__", "__next__"):  # __init__ draws the iterator's base seed (an .item())
        setattr(dl._BaseDataLoaderIter, name, _outside(getattr(dl._BaseDataLoaderIter, name)))


def _no_fake_saves(torch) -> None:
    """torch.save of tensors without data (a checkpoint) is refused before a byte is written: the
    program's line is then named with the switch that skips it (launcher/fullsize.py)."""
    import functools

    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_flatten
    orig = torch.save

    @functools.wraps(orig)
    def save(obj, f, *args, **kwargs):
        flat = tree_flatten(obj)[0]
        local = [getattr(t, "_local_tensor", t) for t in flat]
        if any(isinstance(t, FakeTensor) for t in local):
            raise RuntimeError("torch.save of tensors without data (a full-size run's tensors are fake): nothing "
                               "written")
        return orig(obj, f, *args, **kwargs)

    torch.save = save


def _optimizers_as_on_gpus(torch) -> None:
    """torch's optimizers pick their foreach (multi-tensor) implementation by default when every
    tensor is on a GPU; the simulated GPU's tensors are CPU tensors, so the choice is made as on GPUs."""
    import torch.optim.optimizer as opt

    orig = opt._default_to_fused_or_foreach

    def as_on_gpus(params, differentiable, use_fused=False):
        return False, not differentiable and not use_fused

    for mod in list(sys.modules.values()):  # adam.py, sgd.py... imported it by name
        if mod is not None and getattr(mod, "_default_to_fused_or_foreach", None) is orig:
            mod._default_to_fused_or_foreach = as_on_gpus


def _sdpa_as_on_gpus(torch) -> None:
    """F.scaled_dot_product_attention without a mask on bf16/fp16 inputs runs FlashAttention's op on a
    Hopper GPU (aten._scaled_dot_product_flash_attention: its outputs, what activation checkpointing
    policies name and save); on the CPU torch would pick its CPU op, which such policies do not name.
    Under the fake mode the GPU op's shapes come from its meta function, so the GPU's op is called.
    The replacement keeps torch's name: context parallel's ``context_parallel()`` (torch's monkey-patch
    dispatch) replaces ``F.<fn.__name__>`` with its ring, which another name would leave unused."""
    import functools

    import torch.nn.functional as F
    orig = F.scaled_dot_product_attention
    flash = torch.ops.aten._scaled_dot_product_flash_attention.default

    @functools.wraps(orig)
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is None and query.dim() == 4 and query.dtype in (torch.bfloat16, torch.float16):
            return flash(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        return orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa


def _install(torch, local_world_size: int, local_rank: int, gpu: str) -> None:
    """The simulated GPU (without its memory tracker: the recorder counts), the fake backend, and the
    changes above that make a CPU process take a GPU's paths."""
    from simcluster.launcher.instrument.gpu.device import install_device
    from simcluster.launcher.instrument.gpu.dist import install_mesh
    from simcluster.launcher.instrument.gpu.kernels import install_kernels, install_standins
    from simcluster.launcher.instrument.gpu.tensors import install_tensors

    install_device(torch, local_world_size, local_rank, gpu)
    install_tensors(torch)
    install_kernels(torch)
    install_standins()
    import torch.distributed.device_mesh  # noqa: F401  (the "cuda" mesh, built on the CPU)
    install_mesh(torch)
    for change in (_mesh_outside_fake, _fake_backend, _same_tensor_swap, _optimizers_as_on_gpus, _host_data_real,
                   _loader_batches_real, _no_fake_saves, _sdpa_as_on_gpus):
        change(torch)


class _ProgramExit(SystemExit):
    """The program's own ``os._exit(code)`` in its main thread, made an exit that unwinds to
    _run_program: the trace is then written (the built-in trainer ends a fresh interpreter so)."""


def _exit_unwinds() -> None:
    """os._exit in the program's main thread and process raises _ProgramExit; elsewhere (a forked
    worker, another thread) it stays torch's and the OS's."""
    import threading

    orig, pid = os._exit, os.getpid()

    def _exit(code):
        if os.getpid() == pid and threading.current_thread() is threading.main_thread():
            raise _ProgramExit(code)
        orig(code)

    os._exit = _exit


def _run_program(script: str | None, module: str | None) -> str | None:
    """Run the program as __main__; its failure (a traceback, or a non-zero exit) or None."""
    orig_exit = os._exit
    _exit_unwinds()
    try:
        if script:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
        else:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code not in (None, 0):
            return f"the program exited with {e.code}"
    except Exception as e:  # the program's own failure under the fake mode: reported with its line
        import traceback
        return "".join(traceback.format_exception(e))
    finally:
        os._exit = orig_exit
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the program of --script/--module with its arguments, write the trace to --out."""
    ap = argparse.ArgumentParser(prog="simcluster.launcher.instrument.fullsize")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--local-world-size", type=int, required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--out", required=True)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--script")
    what.add_argument("--module")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    prog_args = a.args[1:] if a.args[:1] == ["--"] else a.args
    from simcluster.core.layout import node_of
    local = a.rank % a.local_world_size
    os.environ.update(RANK=str(a.rank), WORLD_SIZE=str(a.world_size), LOCAL_RANK=str(local),
                      LOCAL_WORLD_SIZE=str(a.local_world_size), MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29500"), GROUP_RANK=str(node_of(a.rank, a.local_world_size)))
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from simcluster.launcher.instrument.fullsize_real import RecordedMemory, real_mode
    from simcluster.train.plan.fullsize.record import Recorder
    from simcluster.train.plan.fullsize.trace import write

    _install(torch, a.local_world_size, local, a.gpu)
    rec = Recorder()
    from simcluster.launcher.instrument.gpu import memory
    memory.COUNTER = RecordedMemory(rec)
    started = time.monotonic()
    sys.argv = [a.script or a.module, *prog_args]
    with FakeTensorMode(allow_non_fake_inputs=True), rec, real_mode(torch):
        error = _run_program(a.script, a.module)
    write(a.out, rec, rank=a.rank, world_size=a.world_size, seconds=time.monotonic() - started, error=error)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: fake groups and fake tensors need none


if __name__ == "__main__":
    sys.exit(main())
