"""Preflight: every check a run can fail before any process group exists. Torch-free.

    python -m train --mesh 2x2x3 --model tiny        # exits 2: "n_heads=4 is not divisible by tp=3 ..."
    python -c "from train.preflight import preflight; from train.config import Config; preflight(Config())"
"""
from __future__ import annotations

import os

from train.config import SCHEDULES, Config, ConfigError, TrainRun, resolve


def data_files(path: str) -> list[str]:
    """The text files of a data path: the file itself, or every file under a folder, sorted.

    Raises:
        ConfigError: the path is missing, unreadable, or holds no non-empty file.
    """
    if not os.path.exists(path):
        raise ConfigError(f"data: {path!r} does not exist; pass --data FILE_OR_FOLDER with UTF-8 text")
    if os.path.isdir(path):
        files = sorted(
            os.path.join(root, name)
            for root, dirs, names in os.walk(path)
            for name in names
            if not name.startswith(".")
        )
    else:
        files = [path]
    files = [f for f in files if os.path.isfile(f)]
    unreadable = [f for f in files if not os.access(f, os.R_OK)]
    if unreadable:
        raise ConfigError(f"data: cannot read {unreadable[0]!r}; fix its permissions or pass another --data")
    if not any(os.path.getsize(f) > 0 for f in files):
        raise ConfigError(f"data: {path!r} holds no text (empty); pass a non-empty file or folder with --data")
    return files


def check(cfg: Config, world_size: int | None = None) -> list[str]:
    """All problems of a config, each naming the field, the numbers and a fix. Empty when fine."""
    try:
        return check_run(resolve(cfg), world_size)
    except ConfigError as e:
        return [str(e)]


def check_run(run: TrainRun, world_size: int | None = None) -> list[str]:
    """All problems of a resolved run, each naming the field, the numbers and a fix. Empty when fine."""
    errors: list[str] = []
    cfg, mesh, args = run.config, run.mesh, run.model
    pp, dp, tp = mesh.pp, mesh.dp, mesh.tp
    if world_size is not None and world_size != mesh.world_size:
        errors.append(f"mesh: world size {world_size} != pp*dp*tp = {pp}*{dp}*{tp} = {mesh.world_size}; "
                      f"start {mesh.world_size} processes or change --mesh")
    if args.kind == "llama":
        if args.n_heads % tp:
            errors.append(f"model: n_heads={args.n_heads} is not divisible by tp={tp}; "
                          f"pick tp from {[d for d in range(1, args.n_heads + 1) if args.n_heads % d == 0]} "
                          f"or set --n-heads to a multiple of {tp}")
        if args.dim % args.n_heads:
            errors.append(f"model: dim={args.dim} is not divisible by n_heads={args.n_heads}; change --dim or --n-heads")
        if args.ffn_dim % args.n_heads:  # the fused w13 is grouped by head (train/model.py FeedForward)
            errors.append(f"model: ffn_dim={args.ffn_dim} is not divisible by n_heads={args.n_heads}; set --ffn-dim to "
                          f"a multiple of {args.n_heads}, e.g. {-(-args.ffn_dim // args.n_heads) * args.n_heads}")
    elif args.ffn_dim % tp:
        errors.append(f"model: ffn_dim={args.ffn_dim} is not divisible by tp={tp}; set --ffn-dim to a multiple of {tp}")
    n_stages = run.n_stages
    if args.n_layers < n_stages:
        errors.append(f"model: n_layers={args.n_layers} < pipeline stages = pp*stages_per_rank = {pp}*{run.local_stages}"
                      f" = {n_stages}; use more layers (--n-layers {n_stages}) or a smaller pp")
    for name in ("steps", "microbatches", "global_batch", "seq_len", "stages_per_rank"):
        if getattr(cfg, name) < 1:
            errors.append(f"{name}: must be >= 1, got {getattr(cfg, name)}")
    if args.kind == "llama" and cfg.seq_len < 2:
        errors.append(f"seq_len: must be >= 2 for a language model, got {cfg.seq_len}")
    if cfg.global_batch % (dp * cfg.microbatches) and cfg.microbatches >= 1:
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
    if not 0 < cfg.val_fraction < 1:
        errors.append(f"val_fraction: must be in (0, 1), got {cfg.val_fraction}")
    if cfg.lr <= 0 or cfg.min_lr < 0:
        errors.append(f"lr: must be > 0 and min_lr >= 0, got lr={cfg.lr} min_lr={cfg.min_lr}")
    if cfg.gc_every < 0:
        errors.append(f"gc_every: must be >= 0 steps (0: Python's automatic collection), got {cfg.gc_every}")
    if cfg.timeout_s <= 0:
        errors.append(f"timeout_s: must be > 0 seconds, got {cfg.timeout_s}")
    if cfg.resume is not None:
        from train.checkpoint_paths import resolve_resume

        try:
            resolve_resume(cfg.resume)
        except FileNotFoundError as e:
            errors.append(f"{e}; pass a step-NNNNNN folder or a run's checkpoints/ folder")
    if cfg.data is not None and args.kind == "llama":
        try:
            data_files(cfg.data)
        except ConfigError as e:
            errors.append(str(e))
    return errors


def preflight(cfg: Config, world_size: int | None = None) -> TrainRun:
    """Validate a config and resolve it, once: the TrainRun every later step reads.

    Raises:
        ConfigError: every problem found, one per line.
    """
    try:
        run = resolve(cfg)
    except ConfigError as e:
        raise ConfigError(f"preflight failed:\n  {e}") from None
    errors = check_run(run, world_size)
    if errors:
        raise ConfigError("preflight failed:\n  " + "\n  ".join(errors))
    return run
