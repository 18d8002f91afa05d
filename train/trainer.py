"""The 3D-parallel training loop: mesh, parallelize on meta, materialize, init, train, log.

    torchrun --nproc-per-node 8 -m train --mesh 2x2x2 --model small --steps 300
    python -m train --mesh 1x1x1 --model tiny --steps 20
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from simcluster.core import hang
from simcluster.train import checkpoint, device, memprobe, stallwatch
from simcluster.train.checkpoint_meta import CheckpointError, data_identity, make_record
from simcluster.core.flags import save_config
from simcluster.train.clip import all_reduce_over, clip_grad_norm_
from simcluster.core.config import Config, TrainRun, traced_steps
from simcluster.train.data import Batches, dp_shard
from simcluster.core.metrics import MetricsWriter, peak_rss_mb, step_line
from simcluster.train.model import loss_fn
from simcluster.train.optim import build_optimizer
from simcluster.train.parallel import apply_fsdp, apply_tp, init_weights
from simcluster.train.pipeline import apply_pp, build_stage_modules
from simcluster.train.profiling import maybe_profile, merge_traced_steps
from simcluster.core.runlog import write_data
from simcluster.train.runtime import GarbageCollection, freeze_imports, tune_malloc
from simcluster.train import traffic as traffic_acct


EXIT_DIVERGED = 3  # exit code of a run stopped by a non-finite loss or grad norm (2: bad config or checkpoint)


class TrainingDiverged(RuntimeError):
    """The loss, validation loss or grad norm became nan or inf (the same on every rank: all-reduced)."""


def init_distributed(cfg: Config) -> tuple[int, int, int]:
    """Start the process group (gloo on cpu, nccl on cuda, train/device.py): from torchrun's env,
    or alone (world size 1).

    Returns (rank, local_rank, world_size).
    """
    # with the stall watch on, a collective's timeout leaves it time to collect and name the hang first
    timeout = timedelta(seconds=stallwatch.group_timeout_s(cfg.stall_s, cfg.timeout_s))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device.bind(cfg.device, local_rank)  # cuda: this rank's GPU, before the group exists
    bound = device.process_group_device(cfg.device, local_rank)
    kw = {"timeout": timeout, **({"device_id": torch.device(bound)} if bound else {})}
    if "RANK" in os.environ:
        dist.init_process_group(device.backend(cfg.device), **kw)
    else:
        dist.init_process_group(device.backend(cfg.device), store=dist.HashStore(), rank=0, world_size=1, **kw)
    return dist.get_rank(), local_rank, dist.get_world_size()


class Trainer:
    """One rank's part of a run. Build with a preflighted TrainRun inside an initialized process group."""

    def __init__(self, job: TrainRun, rank: int, local_rank: int):
        self.job, self.cfg, self.rank = job, job.config, rank
        self.spec, self.args = job.mesh, job.model
        cfg = self.cfg
        pp, dp, tp = self.spec.pp, self.spec.dp, self.spec.tp
        self.device = device.rank_device(cfg.device, local_rank)
        self.mesh = init_device_mesh(device.mesh_device_type(cfg.device), (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        memprobe.mark("mesh")
        self.pp_rank, self.dp_rank, self.tp_rank = self.spec.coords(rank)
        # the step's sums over the world go tp, dp, then pp (clip.py all_reduce_over)
        self.sync_groups = [self.mesh[d].get_group() for d in ("tp", "dp", "pp") if self.mesh[d].size() > 1]

        def parallelize(model):
            apply_tp(model, self.mesh["tp"])
            return apply_fsdp(model, self.mesh["dp"])

        modules, ids, n_stages = build_stage_modules(job, self.pp_rank, parallelize)
        for m in modules:
            m.to_empty(device=self.device)
            init_weights(m, cfg.seed, self.args.n_layers)
        self.pipe = apply_pp(modules, ids, n_stages, self.mesh["pp"], job, loss_fn)
        self.params = [p for m in modules for p in m.parameters()]
        self.optims = [build_optimizer(m, cfg) for m in modules]  # (AdamW, LR schedule) per model part
        self.start_step = 0
        if job.resume_path:
            self.start_step = checkpoint.resume(job.resume_path, cfg.global_batch, self.pipe.modules, self.optims)
            if rank == 0:
                for note in job.resume_notes:
                    print(f"[simcluster] {note}", flush=True)
                print(f"[simcluster] resumed from {job.resume_path} at step {self.start_step}", flush=True)
        memprobe.mark("model")
        self._data_id: dict | None = None  # the corpus identity recorded in checkpoints, computed at the first save
        self.batches = Batches(cfg, self.args)
        self.trace_steps = set(traced_steps(cfg))
        self.traffic = None  # off: no dispatch mode is ever installed (tests/test_traffic.py checks)
        if cfg.traffic:
            self.traffic = traffic_acct.TrafficMode(rank, self.spec.ranks_per_node, traffic_acct.group_kinds(self.mesh))
            self.traffic_log = traffic_acct.TrafficLog(cfg.run_dir, rank, keep_until=self.start_step)
        self.rank_writer = MetricsWriter(os.path.join(cfg.run_dir, "ranks") if cfg.rank_metrics else None,
                                         name=f"rank-{rank}.jsonl")
        print(f"[simcluster] rank={rank} local_rank={local_rank} world_size={self.spec.world_size} "
              f"host={socket.gethostname()} coords=pp{self.pp_rank}/dp{self.dp_rank}/tp{self.tp_rank} "
              f"stages={ids}", flush=True)

    def _shard(self, batch):
        return [dp_shard(t, self.dp_rank, self.spec.dp).to(self.device) for t in batch]

    def _stats(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """(1 + world_size,) float64: slot 0 this rank's share of the global-batch mean loss (0 off
        the last stage, whose dp*tp ranks each hold the mean of theirs), slot 1 + rank its peak
        RSS MB. Summed over the world: the mean loss and every rank's RSS."""
        stats = torch.zeros(1 + self.spec.world_size, dtype=torch.float64, device=self.device)
        if losses:
            stats[0] = torch.stack([l.detach() for l in losses]).double().mean() / self.spec.ranks_per_node
        stats[1 + self.rank] = peak_rss_mb()
        return stats

    def _global_mean(self, losses: list[torch.Tensor]) -> tuple[float, list[float]]:
        """(global-batch mean loss, peak RSS MB of every rank): one sum over the world (clip.py)."""
        stats = self._stats(losses)
        all_reduce_over(stats, self.sync_groups)
        return float(stats[0]), stats[1:].tolist()

    def train_step(self, step: int) -> dict:
        """One optimizer step on global batch ``step`` (1-based); returns its metrics record."""
        t0 = time.perf_counter()
        lr = self.optims[0][1].get_last_lr()[0]
        inputs, targets = self._shard(self.batches.train(step))
        with self.traffic if self.traffic is not None else contextlib.nullcontext():
            losses = self.pipe.step(inputs, targets)
            stats = self._stats(losses)  # summed over the world in the clipping all-reduce
            with self.traffic.as_one("world_all_reduce") if self.traffic is not None else contextlib.nullcontext():
                norm = clip_grad_norm_(self.params, self.cfg.max_norm, self.spec.ranks_per_node, extra=stats,
                                       groups=self.sync_groups)
        if self.rank_writer.path:
            digest = hashlib.sha1(repr(inputs.flatten().tolist()).encode()).hexdigest()
            self.rank_writer.write({"step": step, "inputs_sha1": digest,
                                    "losses": [float(l.detach()).hex() for l in losses], "grad_norm": float(norm).hex()})
        for opt, sched in self.optims:
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        loss, rss = float(stats[0]), stats[1:].tolist()
        dt = time.perf_counter() - t0
        extra = {}
        if self.traffic is not None:  # after the step's timing: the accounting's own all-reduce is not counted
            mine = traffic_acct.summarize(self.traffic.take())
            self.traffic_log.write(step, mine)
            extra["traffic"] = traffic_acct.world_totals(mine, self.spec.pp)
        return {**extra, "step": step, "total_steps": self.cfg.steps, "loss": loss, "grad_norm": float(norm), "lr": lr,
                "step_time_s": dt, "tokens_per_s": self.job.tokens_per_step / dt, "rss_mb": rss}

    @torch.no_grad()
    def validate(self) -> float:
        """Mean loss over ``val_batches`` held-out global batches."""
        total = 0.0
        for k in range(self.cfg.val_batches):
            total += self._global_mean(self.pipe.step(*self._shard(self.batches.val(k)), train=False))[0]
        return total / self.cfg.val_batches

    def _fit_step(self, step: int, writer: MetricsWriter) -> dict:
        """Train (and maybe validate, log, checkpoint) step ``step``; returns its record."""
        cfg, rec = self.cfg, {}
        traced = step in self.trace_steps
        self.pipe.set_traced(traced)
        with maybe_profile(traced, cfg.run_dir, self.rank, self.pp_rank, step, rec,
                           first=traced and step == min(self.trace_steps)):
            rec.update(self.train_step(step))
        bad = diverged(rec)
        if not bad and cfg.val_every and (step % cfg.val_every == 0 or step == cfg.steps):
            rec["val_loss"] = self.validate()
            bad = diverged(rec)
        writer.write(rec)
        if self.rank == 0 and (bad or step % cfg.log_every == 0 or step == cfg.steps or step == 1):
            print(step_line(rec, cfg.steps), flush=True)
        if bad:
            raise TrainingDiverged(f"{bad} at step {step}; lower --lr (now {cfg.lr:g}), raise --warmup-steps (now "
                                   f"{cfg.warmup_steps}) or clip harder with --max-norm (now {cfg.max_norm:g}); no "
                                   f"checkpoint was written for this step")
        if cfg.ckpt_every and (step % cfg.ckpt_every == 0 or step == cfg.steps):
            if self._data_id is None:
                self._data_id = data_identity(self.job)
            path = checkpoint.save(os.path.join(cfg.run_dir, "checkpoints"), step, cfg.global_batch, self.pipe.modules,
                                   [opt for opt, _ in self.optims], cfg.ckpt_keep,
                                   make_record(self.job, step, self._data_id))
            if self.rank == 0:
                print(f"[simcluster] checkpoint step {step}: {path}", flush=True)
        return rec

    def fit(self) -> dict:
        """Train ``cfg.steps`` steps; rank 0 logs a line per step and writes metrics.jsonl."""
        cfg = self.cfg
        writer = MetricsWriter(cfg.run_dir if self.rank == 0 else None, keep_until=self.start_step)
        start, rec, tok_s = time.perf_counter(), {}, []
        with GarbageCollection(cfg.gc_every) as collector:
            for step in range(self.start_step + 1, cfg.steps + 1):
                rec = self._fit_step(step, writer)
                stallwatch.note_step()
                memprobe.mark(f"step {step}")
                tok_s.append(rec["tokens_per_s"])
                collector.step(step)
        wall = time.perf_counter() - start
        if self.trace_steps & set(range(self.start_step + 1, cfg.steps + 1)):
            merge_traced_steps(cfg.run_dir, self.spec.world_size, self.spec.ranks_per_node, cfg.schedule,
                               self.job.n_stages, cfg.microbatches)
        if not tok_s:
            return rec
        steady = statistics.median_high(tok_s[1:] or tok_s)
        if self.rank == 0:
            print(f"done steps={cfg.steps} final_loss={rec['loss']:.4f} tokens_per_s={steady:.0f} "
                  f"wall_s={wall:.1f} run_dir={cfg.run_dir}", flush=True)
        return rec


def diverged(rec: dict) -> str | None:
    """'loss is nan' (or grad_norm, val_loss; nan or inf) when a step's record is not finite, else None."""
    return next((f"{key} is {rec[key]}" for key in ("loss", "grad_norm", "val_loss")
                 if key in rec and not math.isfinite(rec[key])), None)


def run(job: TrainRun) -> int:
    """Run a preflighted TrainRun on this process's rank; returns the exit code: 0 done,
    1 a checkpoint could not be written, 2 the checkpoint cannot be loaded, EXIT_DIVERGED (3) the loss or grad norm became non-finite
    (every rank agrees: both are all-reduced). Other failures raise."""
    cfg = job.config
    torch.set_num_threads(cfg.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    tune_malloc()
    freeze_imports()  # the teardown's gc.collect() below then walks this run's objects only
    memprobe.on(cfg.run_dir, cfg.memory_probe)  # off (0): every mark returns at once
    if cfg.check_collectives:  # torch reads it when torch.distributed is imported: a forked rank re-reads it here
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        torch._C._distributed_c10d.set_debug_level_from_env()
    rank, local_rank, _ = init_distributed(cfg)
    if "RANK" in os.environ:  # under torchrun: the stall watch and the communication record
        stallwatch.start(hang.stall_limit(cfg.stall_s, cfg.timeout_s), cfg.run_dir, rank)
    memprobe.mark("process group")
    trainer, together = None, False  # together: every rank ends at the same step (done, or diverged)
    try:
        if rank == 0:
            save_config(cfg, cfg.run_dir)
            write_data(cfg.run_dir, data_identity(job))
            print("[simcluster] config: " + " ".join(f"{k}={v}" for k, v in cfg.to_dict().items()), flush=True)
        trainer = Trainer(job, rank, local_rank)
        trainer.fit()
        together = True
    except CheckpointError as e:
        print(f"error: rank {rank}: {e}", file=sys.stderr, flush=True)
        return 2
    except checkpoint.CheckpointSaveError as e:
        print(f"error: rank {rank}: {e}", file=sys.stderr, flush=True)
        return 1
    except TrainingDiverged as e:
        together = True
        if rank == 0:
            print(f"error: training diverged: {e}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    finally:
        try:
            # Ranks that end together tear down together under gloo: a peer that closes its
            # connections while rank 0 still writes its last record and line can make gloo's event
            # loop in rank 0 throw on the closed socket, which aborts the process (SIGABRT before
            # rank 0's error line, on a diverged run in the suite).
            if together and dist.get_backend() == "gloo":
                dist.barrier()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a failed peer may have broken the group already
            print(f"[simcluster] rank={rank}: process group teardown failed", file=sys.stderr)
        # Free the process groups (held by the FSDP states, pipeline stages and mesh) now, while
        # the interpreter is whole: a gloo worker thread still releasing its last collective's
        # tensors needs the GIL, and at interpreter exit that aborted the rank ("terminate
        # called without an active exception", about 1 run in 10 on 1x2x1).
        del trainer
        gc.collect()
    return 0
