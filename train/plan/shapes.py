"""What the model's shapes give: each rank's parameter shards and each stage's activations and
FLOPs per microbatch. Nothing is allocated (meta device, fake tensors); no process group.

    python -c "from simcluster.train.plan.shapes import shard_table; from simcluster.core.config import *; print(shard_table(resolve(Config(mesh='2x2x2', model='tiny')), 5)[:3])"

Sharding rules (those of train/parallel.py, torch 2.13): a tensor-parallel Linear's weight is
``Shard(0)`` under ``ColwiseParallel`` and ``Shard(1)`` under ``RowwiseParallel``, its bias
``Shard(0)`` and ``Replicate`` (torch.distributed.tensor.parallel.style). FSDP2 (``fully_shard``,
one group per block, then the root) shards the tp-local tensor's dim 0 over dp as ``torch.chunk``
does (``Shard.local_shard_size_and_offset``); its all-gather input is each rank's chunk padded to
ceil(dim0 / dp) rows, its reduce-scatter input dp of those. Units: elements (float32 throughout,
4 bytes: the trainer has no mixed precision).

Activations come from one forward of the stage under ``FakeTensorMode`` on the CPU device rather
than on meta: operators dispatch as on the real device, so attention takes the CPU flash kernel
(it saves its output and logsumexp) where meta takes the math path (it saves the probabilities,
9% more for the tiny model). On the tiny model the saved bytes equal a real CPU forward's exactly.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Shard
from torch.utils.flop_counter import FlopCounterMode

from simcluster.core.config import ModelArgs, TrainRun
from simcluster.train.model import build_model, loss_fn, prune_to_stage
from simcluster.train.parallel import SEED_TP_PLAN, TP_PLAN
from simcluster.train.plan.flops import counter_mapping
from simcluster.train.split import split_layers, stage_ids

F32 = 4
# ParallelStyle -> {parameter name: the dim it shards (None: replicated)}
STYLE_DIMS = {ColwiseParallel: {"weight": 0, "bias": 0}, RowwiseParallel: {"weight": 1, "bias": None}}


@dataclass(frozen=True)
class ParamShard:
    """One parameter as one rank holds it.

    fqn: the full model's name; group: its FSDP group ("layers.3", or "" for the root);
    full: the unsharded shape; tp_local: after tensor parallel; local: after FSDP as well (what
    ``to_local()`` holds); padded: elements of the FSDP all-gather input (= local without FSDP).
    """

    fqn: str
    group: str
    full: tuple[int, ...]
    tp_local: tuple[int, ...]
    local: tuple[int, ...]
    padded: int


def _tp_dim(fqn: str, kind: str) -> int | None:
    plan = SEED_TP_PLAN if kind == "seed" else TP_PLAN
    parts = fqn.split(".")
    if parts[0] != "layers":
        return None  # embedding, norm and head stay replicated over tp
    style = plan.get(".".join(parts[2:-1]))
    return STYLE_DIMS[type(style)][parts[-1]] if style is not None else None


def _chunk(shape: tuple[int, ...], dim: int, n: int, i: int) -> tuple[int, ...]:
    size, _ = Shard.local_shard_size_and_offset(shape[dim], n, i)
    return shape[:dim] + (size,) + shape[dim + 1:]


@functools.lru_cache(maxsize=64)
def stage_param_shapes(model: ModelArgs, stage: int, n_stages: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(fqn, full shape) of every parameter of one pipeline stage, from the meta-device model."""
    with torch.device("meta"):
        m = build_model(model)
    prune_to_stage(m, split_layers(model.n_layers, n_stages)[stage], is_first=stage == 0, is_last=stage == n_stages - 1)
    return tuple((fqn, tuple(p.shape)) for fqn, p in m.named_parameters())


def shard_table(run: TrainRun, rank: int, stage: int | None = None) -> list[ParamShard]:
    """Every parameter of the stages ``rank`` holds (or of one ``stage``), sharded as that rank holds it."""
    mesh = run.mesh
    pp_rank, dp_rank, tp_rank = mesh.coords(rank)
    stages = [stage] if stage is not None else stage_ids(pp_rank, mesh.pp, run.local_stages, run.layout)
    out = []
    for s in stages:
        for fqn, full in stage_param_shapes(run.model, s, run.n_stages):
            dim = _tp_dim(fqn, run.model.kind)
            tp_local = _chunk(full, dim, mesh.tp, tp_rank) if dim is not None and mesh.tp > 1 else full
            local = _chunk(tp_local, 0, mesh.dp, dp_rank) if mesh.dp > 1 else tp_local
            padded = math.ceil(tp_local[0] / mesh.dp) * math.prod(tp_local[1:])
            group = ".".join(fqn.split(".")[:2]) if fqn.startswith("layers.") else ""
            out.append(ParamShard(fqn, group, full, tp_local, local, padded))
    return out


def state_bytes(run: TrainRun, rank: int) -> dict[str, int]:
    """{"params", "grads", "optimizer", "gathered"} bytes one rank holds after TP and FSDP sharding.

    gathered: FSDP's unsharded parameters (dp > 1), each stage's tp-local whole, held from its
    first forward to the end of its backward (reshard_after_forward=False); MemTracker counts
    them as PARAM beside the shards. grads: one per parameter, shaped as its shard (FSDP2 reduce-scatters into the shard; TP
    grads are DTensors like their parameter). optimizer: AdamW's exp_avg and exp_avg_sq per
    parameter plus its ``step``, a 0-dim float32 tensor per parameter (fused and foreach alike).
    """
    shards = shard_table(run, rank)
    params = sum(math.prod(s.local) for s in shards) * F32
    gathered = sum(math.prod(s.tp_local) for s in shards) * F32 if run.mesh.dp > 1 else 0
    return {"params": params, "grads": params, "optimizer": 2 * params + F32 * len(shards), "gathered": gathered}


def _tp_local_module(model: ModelArgs, n_stages: int, stage: int, tp: int) -> torch.nn.Module:
    """The stage's module (call inside a FakeTensorMode) with each tensor-parallel weight replaced
    by tp rank 0's local piece: a plain module computing what one tp rank computes between the
    all-reduces. (Every tp rank's piece has the same shape: preflight lets tp divide n_heads and
    ffn_dim, train/preflight.py shape_errors.)"""
    m = build_model(model)
    prune_to_stage(m, split_layers(model.n_layers, n_stages)[stage], is_first=stage == 0, is_last=stage == n_stages - 1)
    for fqn, p in list(m.named_parameters()):
        dim = _tp_dim(fqn, model.kind)
        if dim is not None and tp > 1:
            owner = m.get_submodule(fqn.rsplit(".", 1)[0])
            setattr(owner, fqn.rsplit(".", 1)[1], torch.nn.Parameter(torch.empty(_chunk(tuple(p.shape), dim, tp, 0))))
    return m


@dataclass(frozen=True)
class StageCost:
    """One stage on one tp rank, per microbatch. saved_bytes: what its forward saves for backward
    (parameters and the stage input excluded, each storage once); output_bytes: its output, which
    the pipeline keeps until the microbatch's backward (logits on the last stage); input_bytes:
    its input (0 for token ids); fwd_flops, bwd_flops: ``FlopCounterMode`` counts with flops.py's
    mapping (matmuls and attention, the CPU flash kernel by its CUDA twin's formula, halved when
    causal), as calibrate.block_flops counts what `local`'s FLOP/s divides; the last stage's include
    the loss)."""

    saved_bytes: int
    output_bytes: int
    input_bytes: int
    fwd_flops: int
    bwd_flops: int


def stage_cost(run: TrainRun, stage: int) -> StageCost:
    """StageCost of ``stage`` on any of its tp ranks, from one fake-tensor forward and backward."""
    return _stage_cost(run.model, run.n_stages, stage, run.mesh.tp, run.microbatch_size, run.config.seq_len)


@functools.lru_cache(maxsize=256)
def _stage_cost(model: ModelArgs, n_stages: int, stage: int, tp: int, mb: int, seq_len: int) -> StageCost:
    lm = model.kind == "llama"
    prefix = (mb, seq_len) if lm else (mb,)
    with FakeTensorMode(allow_non_fake_inputs=True):
        m = _tp_local_module(model, n_stages, stage, tp)
        if stage == 0 and lm:
            inp = torch.zeros(prefix, dtype=torch.int64)
        else:
            inp = torch.empty(*prefix, model.dim, requires_grad=True)
        params = {p.untyped_storage()._cdata for p in m.parameters()} | {inp.untyped_storage()._cdata}
        seen: dict[int, int] = {}

        def pack(t):
            s = t.untyped_storage()
            if s._cdata not in params:
                seen[s._cdata] = s.nbytes()
            return t

        with saved_tensors_hooks(pack, lambda t: t), FlopCounterMode(display=False, custom_mapping=counter_mapping()) as fwd:
            out = m(inp)
            output_bytes = out.numel() * out.element_size()
            if stage == n_stages - 1:
                out = loss_fn(out, torch.zeros(prefix, dtype=torch.int64))
        with FlopCounterMode(display=False, custom_mapping=counter_mapping()) as bwd:
            out.backward(torch.ones_like(out))
    input_bytes = inp.numel() * inp.element_size() if inp.dtype.is_floating_point else 0
    return StageCost(sum(seen.values()), output_bytes, input_bytes, fwd.get_total_flops(), bwd.get_total_flops())
