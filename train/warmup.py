"""The trainer's first step run once in torchrun's agent, on torch's fake process group, before its ranks are forked.

    python -c "from simcluster.train.warmup import warm_up; print(warm_up(['--mesh', '2x1x1', '--model', 'tiny']))"

Why: a forked rank shares its node's imported pages copy-on-write, and in CPython every object a
rank touches is written (its reference count), as is every function it runs for the first time
(3.11 counts a code object's calls, then rewrites its bytecode in place, specialized), and the
caches the stack fills on first use are made in each rank. A page written is copied into the rank,
and most of a forked rank's own memory is such copies (train/memprobe.py's marks; BENCHMARKS.md,
"512 ranks"). So ``warm_up`` runs, in the process the ranks are forked from (train/forkrun.py), the
job's own configuration as one of the node's ranks on torch's fake process group (no data moves,
no thread starts; train/plan/measure.py runs the planner's ranks the same way): the Trainer built
(mesh, model, FSDP2, TP, pipeline stages, optimizer), one training step and one validation. Its
objects are then freed and the caches that hold its DeviceMesh cleared (DTensor's sharding
propagation, in Python and C++: a sub-mesh equals every rank's sub-mesh of its dimension, so a
cached result would hand a rank the warm-up's mesh and its destroyed groups). A warm-up that fails
leaves the ranks to run as they would without it. Nothing is written to the run folder,
nothing printed. Only for the built-in trainer (the user's code is never run before the fork).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import io
import shutil
import tempfile


def _static_vote(orig):
    """The schedule's shape vote answered STATIC, as every rank of the trainer answers (train/plan/measure.py)."""
    import torch

    def vote(self, received_result=None):
        orig(self, received_result)
        return torch.ones(1, dtype=torch.int32)
    return vote


def clear_caches() -> None:
    """Forget what the distributed stack cached with the warm-up's DeviceMesh in it: every
    ``functools`` cache of a torch.distributed function (DTensor's strategies and sharding
    propagation, the mesh topology) and the mesh registry. A sub-mesh equals every rank's sub-mesh
    of that dimension, so a cached result would hand a rank the warm-up rank's process groups."""
    import torch
    from torch.distributed.device_mesh import _mesh_resources
    from torch.distributed.tensor import DTensor

    for obj in gc.get_objects():
        if type(obj) is functools._lru_cache_wrapper and str(getattr(obj, "__module__", "")).startswith(
                "torch.distributed"):
            obj.cache_clear()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    if hasattr(torch._C, "_clear_DTensor_sharding_propagator_cache"):  # the dispatch's C++ fast path's cache
        torch._C._clear_DTensor_sharding_propagator_cache()
    for value in vars(_mesh_resources).values():
        if isinstance(value, (dict, list)):
            value.clear()


def warm_up(train_argv: list[str], rank: int = 0) -> bool:
    """Run the trainer's configuration ``train_argv`` (``python -m train``'s arguments) for one step
    as rank ``rank`` on the fake process group, then free it. Returns False, having run nothing,
    when the configuration does not pass preflight (the ranks then report it), holds several
    pipeline stages a rank, or this process is already in a process group, and False after cleaning up when the step raised."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from simcluster.core.flags import add_config_args, config_from_args
    from simcluster.core.errors import ConfigError
    from simcluster.train.preflight import preflight
    from simcluster.train.trainer import Trainer

    parser = argparse.ArgumentParser(add_help=False)
    add_config_args(parser)
    scratch = tempfile.mkdtemp(prefix="simcluster-warmup-")
    try:
        cfg = config_from_args(parser.parse_args(train_argv))
        cfg = dataclasses.replace(cfg, run_dir=scratch, steps=1, val_every=1, val_batches=1, ckpt_every=0,
                                  resume=None, profile_step=0, trace_steps=None, traffic=0, rank_metrics=0,
                                  memory_probe=0, log_every=1)
        job = preflight(cfg, world_size=None)
    except (ConfigError, SystemExit):
        job = None
    # one stage a rank only (gpipe, 1f1b): with several, the schedule's fake p2p vote leaves a
    # rank's local stage pair without its backward, and the step fails
    if job is None or job.n_stages != job.mesh.pp or dist.is_initialized() or not 0 <= rank < job.mesh.world_size:
        shutil.rmtree(scratch, ignore_errors=True)
        return False
    vote, threads = PipelineStage._warmup_backward_result, torch.get_num_threads()
    PipelineStage._warmup_backward_result = _static_vote(vote)
    torch.set_num_threads(1)  # no intra-op pool: the process must stay single-threaded for the fork
    torch.set_flush_denormal(True)  # the fake receives leave garbage in their buffers
    trainer = None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=job.mesh.world_size)
            trainer = Trainer(job, rank, 0)
            trainer.train_step(1)
            trainer.validate()
    except Exception:  # noqa: BLE001 - the ranks run without it, and meet the problem themselves if it is real
        return False
    finally:
        del trainer
        if dist.is_initialized():
            dist.destroy_process_group()
        clear_caches()
        PipelineStage._warmup_backward_result = vote
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
        gc.collect()
        shutil.rmtree(scratch, ignore_errors=True)
    return True
