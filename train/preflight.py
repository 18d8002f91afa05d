"""Preflight: every check a run can fail before any process group exists. Torch-free.

    python -m train --mesh 2x2x3 --model tiny        # exits 2: "n_heads=4 is not divisible by tp=3 ..."
    python -m train --model tiny --lr nan --data a.bin --resume runs/a   # exits 2, every problem listed
    python -c "from train.preflight import preflight; from simcluster.core.config import Config; preflight(Config())"

Refused here: numbers out of range or not finite (``simcluster.core.preflight_values``), model shapes the
TP plan or attention cannot split, meshes and schedules that cannot place the layers or
microbatches, data that is missing, not UTF-8 or shorter than one window in either split
(``train.corpus``), and a --resume checkpoint that is missing, partial, corrupted or from a run
that cannot continue exactly (``train.checkpoint_meta``).
"""
from __future__ import annotations

import dataclasses

from simcluster.core.config import SCHEDULES, Config, TrainRun, resolve
from simcluster.core.errors import ConfigError
from simcluster.train.corpus import check_corpus
from simcluster.core.preflight_values import value_errors


def check(cfg: Config, world_size: int | None = None) -> list[str]:
    """All problems of a config, each naming the field, the numbers and a fix. Empty when fine."""
    try:
        return check_run(resolve(cfg), world_size)
    except ConfigError as e:
        return [str(e)]


def check_run(run: TrainRun, world_size: int | None = None) -> list[str]:
    """All problems of a resolved run, each naming the field, the numbers and a fix. Empty when fine."""
    return _check(run, world_size)[0]


def _check(run: TrainRun, world_size: int | None) -> tuple[list[str], str | None, list[str]]:
    """(problems, resume checkpoint folder or None, resume notes) of a resolved run."""
    cfg, mesh = run.config, run.mesh
    errors = value_errors(cfg)
    if world_size is not None and world_size != mesh.world_size:
        errors.append(f"mesh: world size {world_size} != pp*dp*tp = {mesh.pp}*{mesh.dp}*{mesh.tp} = {mesh.world_size}; "
                      f"start {mesh.world_size} processes or change --mesh")
    sizes = (run.model.dim, run.model.n_layers, run.model.n_heads, run.model.ffn_dim, cfg.seq_len, cfg.global_batch,
             cfg.microbatches, cfg.stages_per_rank)
    if all(v >= 1 for v in sizes):  # else value_errors has said so, and the divisions below cannot be judged
        errors += shape_errors(run) + schedule_errors(run)
        if cfg.data is not None and run.model.kind == "llama" and 0 < cfg.val_fraction < 1:
            errors += check_corpus(cfg.data, cfg.seq_len, cfg.val_fraction, validates=cfg.val_every > 0)
    path, notes = None, []
    if cfg.resume is not None and all(v >= 1 for v in sizes):
        from simcluster.train.checkpoint_meta import check_resume

        path, resume_errors, notes = check_resume(run)
        errors += resume_errors
    return errors, path, notes


def shape_errors(run: TrainRun) -> list[str]:
    """Model shapes the TP plan (train/parallel.py) or attention cannot split."""
    errors: list[str] = []
    args, tp = run.model, run.mesh.tp
    if args.kind == "llama":
        if args.n_heads % tp:
            errors.append(f"model: n_heads={args.n_heads} is not divisible by tp={tp}; "
                          f"pick tp from {[d for d in range(1, args.n_heads + 1) if args.n_heads % d == 0]} "
                          f"or set --n-heads to a multiple of {tp}")
        if args.dim % args.n_heads:
            errors.append(f"model: dim={args.dim} is not divisible by n_heads={args.n_heads}; change --dim or --n-heads")
        elif (args.dim // args.n_heads) % 2:
            head = args.dim // args.n_heads
            errors.append(f"model: head size dim/n_heads = {args.dim}/{args.n_heads} = {head} is odd; RoPE rotates "
                          f"pairs and needs an even head size: use --dim {args.n_heads * (head + 1)} or other --n-heads")
        if args.ffn_dim % args.n_heads:  # the fused w13 is grouped by head (train/model.py FeedForward)
            errors.append(f"model: ffn_dim={args.ffn_dim} is not divisible by n_heads={args.n_heads}; set --ffn-dim to "
                          f"a multiple of {args.n_heads}, e.g. {-(-args.ffn_dim // args.n_heads) * args.n_heads}")
    else:  # SEED_TP_PLAN shards pair1 (dim -> dim -> dim) and pair2 (dim -> ffn_dim -> dim) over tp
        for name, v in (("dim", args.dim), ("ffn_dim", args.ffn_dim)):
            if v % tp:
                errors.append(f"model: {name}={v} is not divisible by tp={tp} (the seed model shards its "
                              f"{'dim-wide layers (pair1)' if name == 'dim' else 'hidden layer (pair2)'} over tp); "
                              f"set --{name.replace('_', '-')} to a multiple of {tp}, e.g. {-(-v // tp) * tp}, "
                              f"or use tp from {[d for d in range(1, v + 1) if v % d == 0]}")
    if args.n_layers < run.n_stages:
        errors.append(f"model: n_layers={args.n_layers} < pipeline stages = pp*stages_per_rank = {run.mesh.pp}*"
                      f"{run.local_stages} = {run.n_stages}; use more layers (--n-layers {run.n_stages}) or a smaller pp")
    return errors


def schedule_errors(run: TrainRun) -> list[str]:
    """Batch, microbatch and schedule combinations the pipeline cannot run."""
    errors: list[str] = []
    cfg, pp, dp, n_stages = run.config, run.mesh.pp, run.mesh.dp, run.n_stages
    if run.model.kind == "llama" and cfg.seq_len < 2:
        errors.append(f"seq_len: must be >= 2 for a language model, got {cfg.seq_len}")
    if cfg.global_batch % (dp * cfg.microbatches):
        errors.append(f"global_batch={cfg.global_batch} is not divisible by dp*microbatches = {dp}*{cfg.microbatches}"
                      f" = {dp * cfg.microbatches}; use --global-batch {dp * cfg.microbatches * max(1, cfg.global_batch // (dp * cfg.microbatches))}"
                      f" or fewer microbatches")
    cls = SCHEDULES[cfg.schedule][0]
    if cls in ("Schedule1F1B", "ScheduleDualPipeV") and cfg.microbatches < n_stages and pp > 1:
        errors.append(f"microbatches={cfg.microbatches} < pipeline stages={n_stages}, which {cfg.schedule} needs; "
                      f"use --microbatches {n_stages} or more")
    if run.layout == "loop" and pp > 1:
        rounds = max(1, cfg.microbatches // pp)
        if cfg.microbatches % rounds:
            errors.append(f"microbatches={cfg.microbatches} must be a multiple of its rounds = microbatches // pp = {rounds}"
                          f" for {cfg.schedule}; use a multiple of pp={pp}, e.g. --microbatches {2 * pp}")
    return errors


def preflight(cfg: Config, world_size: int | None = None) -> TrainRun:
    """Validate a config and resolve it, once: the TrainRun every later step reads.

    Returns the TrainRun with ``resume_path`` (the checkpoint to load, auto resolved) and
    ``resume_notes`` (what changed against it) filled in.

    Raises:
        ConfigError: every problem found, one per line.
    """
    try:
        run = resolve(cfg)
    except ConfigError as e:
        raise ConfigError(f"preflight failed:\n  {e}") from None
    errors, path, notes = _check(run, world_size)
    if errors:
        raise ConfigError("preflight failed:\n  " + "\n  ".join(errors))
    return dataclasses.replace(run, resume_path=path, resume_notes=tuple(notes))
