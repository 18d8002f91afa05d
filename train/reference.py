"""The single-process reference: the same model, init, data, clipping and AdamW as a mesh run,
with none of the parallelism (no process group, no DTensor, no pipeline, one full batch per step).

    python -m train.reference --model tiny --steps 10 --run-dir runs/ref
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

from simcluster.core.flags import add_config_args, config_from_args, save_config
from simcluster.train.clip import clip_grad_norm_
from simcluster.core.errors import ConfigError
from simcluster.core.config import TrainRun
from simcluster.train.data import Batches
from simcluster.core.metrics import MetricsWriter, peak_rss_mb, step_line
from simcluster.train.model import build_model, loss_fn
from simcluster.train.optim import build_optimizer
from simcluster.train.parallel import init_weights
from simcluster.train.preflight import preflight
from simcluster.train.runtime import GarbageCollection, tune_malloc


def run_reference(run: TrainRun, run_dir: str | None = None,
                  on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Train ``run`` (mesh ignored) in this process; returns per-step records like a mesh run's.

    ``on_step`` is called with each step's record as soon as the step ends (the CLI prints it).
    """
    cfg, args = run.config, run.model
    model = build_model(args)
    init_weights(model, cfg.seed, args.n_layers)
    opt, sched = build_optimizer(model, cfg)
    batches = Batches(cfg, args)
    writer = MetricsWriter(run_dir)
    params = list(model.parameters())
    records = []
    with GarbageCollection(cfg.gc_every) as collector:
        for step in range(1, cfg.steps + 1):
            t0 = time.perf_counter()
            lr = sched.get_last_lr()[0]
            inputs, targets = batches.train(step)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            norm = clip_grad_norm_(params, cfg.max_norm, ranks_per_stage=1)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            dt = time.perf_counter() - t0
            rec = {"step": step, "total_steps": cfg.steps, "loss": float(loss.detach()), "grad_norm": float(norm),
                   "lr": lr, "step_time_s": dt,
                   "tokens_per_s": run.tokens_per_step / dt, "rss_mb": [peak_rss_mb()]}
            writer.write(rec)
            records.append(rec)
            if on_step is not None:
                on_step(rec)
            collector.step(step)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    try:
        run = preflight(config_from_args(parser.parse_args(argv)))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = run.config
    torch.set_num_threads(cfg.threads or 1)
    tune_malloc()
    save_config(cfg, cfg.run_dir)
    run_reference(run, cfg.run_dir, on_step=lambda rec: print(step_line(rec, cfg.steps), flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
