"""Pipeline parallel over the pp mesh with ``torch.distributed.pipelining``.

    python -m train.parity --mesh 2x1x1 --schedule interleaved-1f1b --model tiny --steps 3

``apply_pp`` builds this rank's stage modules on the meta device (each the full model with the
other stages' layers deleted, see ``train.model.prune_to_stage``), hands each to a
``PipelineStage`` over the pp process group, and wraps them in the schedule named by the config.
Activations and gradients cross stages by send/recv on the pp group only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed.pipelining.schedules as schedules
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage

from simcluster.core.config import SCHEDULES, TrainRun
from simcluster.train.model import build_model, prune_to_stage
from simcluster.train.split import split_layers, stage_ids


class TracedStage(PipelineStage):
    """A ``PipelineStage`` that names each microbatch's work for the profiler while ``traced`` is
    True (set by the trainer on ``--trace-steps`` steps only; off, it adds one attribute test):
    ``forward mbM sS``, ``backward mbM sS`` (``backward-input``/``backward-weight`` for the
    zero-bubble schedules' split backward). torch 2.13's gpipe and 1f1b schedules annotate none
    of this, the runtime schedules only their actions (``PP:0F1``)."""

    traced = False

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        if not self.traced:
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        with torch.profiler.record_function(f"forward mb{fwd_chunk_id} s{self.stage_index}"):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        if not self.traced:
            return super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
        name = "backward" if full_backward else "backward-input"
        with torch.profiler.record_function(f"{name} mb{bwd_chunk_id} s{self.stage_index}"):
            return super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        if not self.traced:
            return super().backward_weight_one_chunk(bwd_chunk_id, last_backward)
        with torch.profiler.record_function(f"backward-weight mb{bwd_chunk_id} s{self.stage_index}"):
            return super().backward_weight_one_chunk(bwd_chunk_id, last_backward)


@dataclass
class Pipeline:
    """This rank's share of the pipeline.

    Attributes:
        modules: stage modules, in the order of ``stage_ids``.
        stage_ids: global stage indices held here.
        schedule: the torch schedule (``.step`` trains one global batch shard).
        has_first / has_last: whether this rank holds stage 0 / the last stage.
    """

    modules: list[nn.Module]
    stage_ids: list[int]
    schedule: schedules._PipelineSchedule
    has_first: bool
    has_last: bool
    run: TrainRun | None = None
    group: object = None  # the pp ProcessGroup
    loss_fn: Callable | None = None
    stages: list = None  # the TracedStages

    def set_traced(self, on: bool) -> None:
        """Name each microbatch's forward/backward for the profiler (see TracedStage)."""
        for st in self.stages or []:
            st.traced = on

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, train: bool = True) -> list[torch.Tensor]:
        """Run the schedule on this dp rank's batch; returns the microbatch losses held here.

        inputs/targets: (batch/dp, seq) for the LM. Losses are only returned where has_last.
        Evaluation under the "v" layout (zbv, dualpipev) runs ``forward_only``: those schedules
        cannot ``eval`` in torch 2.13.
        """
        if not train and self.run is not None and self.run.layout == "v":
            return self._forward_only(inputs, targets)
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        kwargs = {"target": targets, "losses": losses} if self.has_last else {}
        if train:
            self.schedule.step(*args, **kwargs)
        else:
            self.schedule.eval(*args, **kwargs)
        return losses

    def _forward_only(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
        from simcluster.train.pipeline_eval import forward_only

        run, batch = self.run, inputs.shape[0]
        tail = (run.config.seq_len, run.model.dim) if run.model.kind == "llama" else (run.model.dim,)
        return forward_only(self.modules, self.stage_ids, run.n_stages, run.local_stages, run.layout, self.group,
                            inputs if self.has_first else None, targets if self.has_last else None,
                            (batch, *tail), self.loss_fn)


def build_stage_modules(run: TrainRun, pp_rank: int, parallelize: Callable[[nn.Module], nn.Module]) -> tuple[list[nn.Module], list[int], int]:
    """Meta-device stage modules for this pp rank, each passed through ``parallelize``.

    Returns (modules, stage ids, total stages).
    """
    args, n_stages = run.model, run.n_stages
    layers = split_layers(args.n_layers, n_stages)
    ids = stage_ids(pp_rank, run.mesh.pp, run.local_stages, run.layout)
    modules = []
    for s in ids:
        with torch.device("meta"):
            model = build_model(args)
        prune_to_stage(model, layers[s], is_first=s == 0, is_last=s == n_stages - 1)
        modules.append(parallelize(model))
    return modules, ids, n_stages


def stage_io(run: TrainRun, stage: int, n_stages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta tensors shaped like one microbatch's input and output of ``stage`` (pure).

    LM: stage 0 takes tokens (mb, seq) int64, later stages hidden states (mb, seq, dim) float32
    that need grad; the last stage returns logits (mb, seq, vocab), the others hidden states
    (all need grad). ``seed``: the same without the seq dimension, and stage 0 takes features
    (mb, dim) float32. mb = global_batch / dp / microbatches. Given to ``PipelineStage`` as
    input_args/output_args, these let the schedule skip its first-step shape inference (a meta
    forward and backward of every stage through DTensor plus metadata messages): stage I/O are
    plain tensors, so torch 2.13 runs in its STATIC mode.
    """
    args, mb = run.model, run.microbatch_size
    if args.kind == "seed":
        prefix = (mb,)
        first = torch.empty(mb, args.dim, device="meta")
    else:
        prefix = (mb, run.config.seq_len)
        first = torch.empty(*prefix, dtype=torch.int64, device="meta")
    hidden = torch.empty(*prefix, args.dim, device="meta", requires_grad=True)
    last = torch.empty(*prefix, args.vocab_size, device="meta", requires_grad=True)
    return (first if stage == 0 else hidden), (last if stage == n_stages - 1 else hidden)


def apply_pp(modules: list[nn.Module], ids: list[int], n_stages: int, pp_mesh: DeviceMesh, run: TrainRun,
             loss_fn: Callable) -> Pipeline:
    """Wrap materialized stage modules into PipelineStages (with static I/O shapes, see
    ``stage_io``) and the configured schedule."""
    group = pp_mesh.get_group()
    device = torch.device("cpu") if run.config.device == "cpu" else torch.device("cuda", torch.cuda.current_device())
    stages = []
    for m, s in zip(modules, ids):
        inp, out = stage_io(run, s, n_stages)
        stages.append(TracedStage(m, s, n_stages, device, input_args=inp, output_args=out, group=group))
    cls = getattr(schedules, SCHEDULES[run.config.schedule][0])
    n = run.config.microbatches
    schedule = cls(stages[0] if run.layout == "single" else stages, n_microbatches=n, loss_fn=loss_fn)
    return Pipeline(modules, ids, schedule, has_first=0 in ids, has_last=n_stages - 1 in ids, run=run, group=group,
                    loss_fn=loss_fn, stages=stages)
