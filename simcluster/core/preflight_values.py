"""Range checks of every numeric Config field: finite, within what the trainer can run. Torch-free.

    python -m train --lr nan          # exits 2: "lr: must be a finite number > 0, got nan; ..."
    python -c "from simcluster.core.preflight_values import value_errors; from simcluster.core.config import Config; print(value_errors(Config(lr=float('inf'))))"
"""
from __future__ import annotations

import math

from simcluster.core.config import Config, step_spans
from simcluster.core.errors import ConfigError

SEED_LIMIT = 2**63  # torch.Generator.manual_seed takes 64-bit seeds; batches and init use seed mod 2**63
TIMEOUT_LIMIT_S = 1e6  # datetime.timedelta and gloo take far more; beyond 11 days a peer is surely gone
# the stall watch's resolution: each rank publishes its progress, and rank 0 looks, once a POLL_S (1 s,
# train/stallwatch.py), so a healthy rank's progress is seen up to 2 s late; a limit of 5 s leaves room
STALL_MIN_S = 5.0


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# field -> (test on the value, what is required, a fix); ints are >= 1 unless listed here
RULES: dict[str, tuple] = {
    "lr": (lambda v: _finite(v) and v > 0, "a finite number > 0", "e.g. --lr 0.003 (the default)"),
    "min_lr": (lambda v: _finite(v) and v >= 0, "a finite number >= 0", "e.g. --min-lr 0.0003 (the default)"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "a finite number >= 0", "e.g. --weight-decay 0.1 (0: off)"),
    "max_norm": (lambda v: _finite(v) and v >= 0, "a finite number >= 0", "e.g. --max-norm 1.0 (0: no clipping)"),
    "timeout_s": (lambda v: _finite(v) and 0 < v <= TIMEOUT_LIMIT_S, f"a finite number of seconds in (0, {TIMEOUT_LIMIT_S:g}]",
                  "e.g. --timeout-s 60 (the default)"),
    "stall_s": (lambda v: v is None or _finite(v) and (v == 0 or STALL_MIN_S <= v <= TIMEOUT_LIMIT_S),
                f"0 (off) or a finite number of seconds in [{STALL_MIN_S:g}, {TIMEOUT_LIMIT_S:g}] (below "
                f"{STALL_MIN_S:g} s the watch, which looks once a second, would call a healthy job hung)",
                "e.g. --stall-s 60 (the default; 0: off)"),
    "val_fraction": (lambda v: _finite(v) and 0 < v < 1, "in (0, 1)", "e.g. --val-fraction 0.05 (the default)"),
    "seed": (lambda v: 0 <= v < SEED_LIMIT, "in [0, 2**63)", "e.g. --seed 0"),
    "warmup_steps": (lambda v: v >= 0, ">= 0", "0: no warmup"),
    "val_every": (lambda v: v >= 0, ">= 0", "0: never validate"),
    "threads": (lambda v: v >= 0, ">= 0", "0: OMP_NUM_THREADS or 1"),
    "gc_every": (lambda v: v >= 0, ">= 0 steps (0: Python's automatic collection)", "e.g. --gc-every 50"),
    "ckpt_every": (lambda v: v >= 0, ">= 0", "0: no checkpoints"),
    "ckpt_keep": (lambda v: v >= 0, ">= 0", "0 keeps every checkpoint"),
    "profile_step": (lambda v: v >= 0, ">= 0", "0: no profiling"),
    "traffic": (lambda v: v in (0, 1), "0 or 1", "1 counts bytes per step, kind and link into RUN_DIR/traffic/"),
    "check_collectives": (lambda v: v in (0, 1), "0 or 1", "1 checks every collective across its group (TORCH_DISTRIBUTED_DEBUG=DETAIL)"),
    "rank_metrics": (lambda v: v in (0, 1), "0 or 1", "1 writes RUN_DIR/ranks/rank-R.jsonl"),
    "memory_probe": (lambda v: v in (0, 1), "0 or 1", "1 writes RUN_DIR/memory/rank-R.jsonl"),
    "microbatches": (lambda v: v >= 0, ">= 0", "0: the fewest the schedule takes"),
}
AT_LEAST_ONE = ("steps", "stages_per_rank", "val_batches", "log_every", "seq_len", "global_batch")
MODEL_OVERRIDES = ("dim", "n_layers", "n_heads", "ffn_dim")


def value_errors(cfg: Config) -> list[str]:
    """Every numeric field out of its range, as 'field: must be ..., got v; fix'. Empty when fine.

    ``cfg`` is the resolved config (seq_len and global_batch filled in); unset (None) overrides
    are skipped.
    """
    errors = []
    for name, (ok, need, fix) in RULES.items():
        v = getattr(cfg, name)
        if not ok(v):
            errors.append(f"{name}: must be {need}, got {v}; {fix}")
    try:
        step_spans(cfg.trace_steps, cfg.steps)  # checked, no list of steps built
    except ConfigError as e:
        errors.append(str(e))
    for name in AT_LEAST_ONE:
        v = getattr(cfg, name)
        if v is not None and v < 1:
            errors.append(f"{name}: must be >= 1, got {v}; pass --{name.replace('_', '-')} 1 or more")
    for name in MODEL_OVERRIDES:
        v = getattr(cfg, name)
        if v is not None and v < 1:
            errors.append(f"{name}: must be >= 1, got {v}; omit --{name.replace('_', '-')} to take the preset's")
    return errors
