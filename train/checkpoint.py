"""Checkpoints with torch.distributed.checkpoint (DCP): mesh-free, atomic, last K kept.

    torchrun --nproc-per-node 8 -m train --mesh 2x2x2 --model tiny --steps 20 --ckpt-every 10 --run-dir runs/a
    torchrun --nproc-per-node 4 -m train --mesh 1x2x2 --model tiny --steps 20 --resume runs/a/checkpoints --run-dir runs/b

A checkpoint holds, keyed by parameter FQN (the same on every mesh): the model, the AdamW state,
and ``train.step``; the LR schedule and the data position are functions of the step, and a
batch is a pure function of (seed, step), so nothing else is needed to resume exactly. The data
position is the count of global samples seen (step * global_batch), so a change of dp neither
repeats nor skips data. DCP reshards on load: a checkpoint saved on one mesh (pp changes
included) loads on any other.

Layout: RUN_DIR/checkpoints/step-000010/ (DCP files, and simcluster.json: what the checkpoint
was made with and every file's size, see ``train.checkpoint_meta``; preflight checks it before a
resume). A save is written to a ``.tmp-`` folder
and renamed once every rank has finished, so a save killed midway never replaces the last
good checkpoint. Multi-node runs need the run folder on a filesystem all nodes share.
"""
from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: not caught by except Exception
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from simcluster.train.checkpoint_meta import CheckpointError, write_record
from simcluster.train.checkpoint_paths import list_checkpoints
from simcluster.train.optim import restore_kernel_flags

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointSaveError(RuntimeError):
    """A save failed (full disk, vanished folder): the message names the folder, the cause and the
    checkpoint that is kept; the half-written one is removed."""


def _state(parts: list[nn.Module], opts: list[torch.optim.Optimizer], samples: int) -> dict:
    model, optim = {}, {}
    for part, opt in zip(parts, opts):
        model.update(get_model_state_dict(part, options=OPTIONS))
        optim.update(get_optimizer_state_dict(part, opt, options=OPTIONS))
    return {"model": model, "optim": optim, "train": {"samples": torch.tensor(samples)}}


def save(folder: str, step: int, global_batch: int, parts: list[nn.Module], opts: list[torch.optim.Optimizer],
         keep: int, record: dict | None = None) -> str:
    """Collective: write step's checkpoint atomically into ``folder``; keep the newest ``keep``.

    The data position is stored as global samples seen, ``step * global_batch``. ``record``
    (``checkpoint_meta.make_record``) is written by rank 0 as simcluster.json, with the DCP
    files' sizes, before the folder is renamed into place.

    Raises:
        CheckpointSaveError: the save failed; the previous checkpoints are untouched.
    """
    final = os.path.join(folder, f"step-{step:06d}")
    tmp = os.path.join(folder, f".tmp-step-{step:06d}")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    try:
        dcp.save(_state(parts, opts, step * global_batch), checkpoint_id=tmp)
        dist.barrier()
        if rank == 0:
            if record is not None:
                write_record(tmp, record)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - a full disk, a vanished folder, ...
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = list_checkpoints(folder)
        last = ([line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__])[-1][:300]
        free = shutil.disk_usage(folder).free / 2**20
        raise CheckpointSaveError(
            f"checkpoint step {step}: cannot write {tmp}: {last} ({free:.1f} MB free on that filesystem); "
            f"free space in {folder} (or lower --ckpt-keep, "
            f"--ckpt-every); " + (f"the previous checkpoint {kept[-1][1]} is kept" if kept else
                                  "no earlier checkpoint exists")) from e
        for _, old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: str, global_batch: int, parts: list[nn.Module], opts: list[torch.optim.Optimizer]) -> int:
    """Collective: load a checkpoint (saved on any mesh) into this rank's parts and optimizers.

    Returns the step to continue after: global samples seen / ``global_batch``.

    Raises:
        CheckpointError: DCP cannot read the checkpoint (corrupted after preflight's size check),
            or its samples seen are not a whole number of this run's global batches.
    """
    state = _state(parts, opts, 0)
    try:
        dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP raises many kinds (pickle, OSError, ...)
        last = ([line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__])[-1][:300]
        raise CheckpointError(f"resume: cannot load the checkpoint {path} (its .metadata or .distcp files are "
                              f"corrupted): {last}; resume from another checkpoint or start fresh without "
                              f"--resume") from e
    for part, opt in zip(parts, opts):
        names = {n for n, _ in part.named_parameters()}
        set_model_state_dict(part, {k: v for k, v in state["model"].items() if k in names}, options=OPTIONS)
        set_optimizer_state_dict(part, opt, {k: v for k, v in state["optim"].items() if _owner(k) in names},
                                 options=OPTIONS)
    samples = int(state["train"]["samples"])
    if samples % global_batch:
        raise CheckpointError(f"resume: checkpoint has seen {samples} samples, not a multiple of global_batch={global_batch};"
                         f" resume with a global batch that divides it")
    return samples // global_batch


def resume(path: str, global_batch: int, parts: list[nn.Module],
           optims: list[tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]]) -> int:
    """Collective: ``load`` a checkpoint (any mesh, checked by preflight) and advance each LR schedule to
    its step; returns the step. This run's hyperparameters win over the checkpoint's: the loaded
    param groups carry the saved lr, weight_decay, betas and eps, which are put back to this
    config's (lr, min_lr, warmup_steps and steps act through the LR schedule, max_norm in clipping).

    Raises:
        CheckpointError: as ``load``.
    """
    keys = ("lr", "initial_lr", "weight_decay", "betas", "eps")
    configured = [[{k: g[k] for k in keys if k in g} for g in opt.param_groups] for opt, _ in optims]
    step = load(path, global_batch, parts, [opt for opt, _ in optims])
    for (opt, sched), groups in zip(optims, configured):
        for g, values in zip(opt.param_groups, groups):
            g.update(values)
        restore_kernel_flags(opt)
        for _ in range(step):
            sched.step()
    return step


def _owner(flat_key: str) -> str:
    """The parameter FQN of a flattened optimizer key (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``)."""
    return flat_key.split(".", 1)[1].rsplit(".", 1)[0]
