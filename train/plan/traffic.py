"""The closed forms of the traffic accounting: bytes and messages per step, by kind and link, of one
rank of the built-in trainer (train/traffic.py's counting rules, applied to shapes and the schedule).

    python -c "from simcluster.train.plan.traffic import rank_traffic; from simcluster.core.config import *; print(rank_traffic(resolve(Config(mesh='2x2x2', model='tiny')), 0))"

The one home of these forms: tests/test_traffic.py checks the accounting against them on real
gloo runs, tests/test_plan.py on every schedule and mesh of the parity matrix. A steady step
(step 2 on); step 1 also carries the schedule's warm-up vote (one 4-byte int32 send each way per
stage boundary, torch 2.13 ``PipelineStage._warmup_forward_vote``), not predicted here.

Per step, with m microbatches of mb = global_batch / dp / m sequences, act = mb x seq x dim x 4
bytes (mb x dim for the seed model), per stage this rank holds:
- pipeline: each microbatch's forward output is sent when the next stage lives on another pp rank,
  its input grad when the previous one does (``pp_send``; the peer's ``pp_recv``), act bytes each;
- tensor parallel (tp > 1): 4 all-reduces of act bytes per block and microbatch (Megatron: after
  the row-parallel wo and w2 forward, of the column-parallel inputs' grads backward);
- FSDP2 (dp > 1, no resharding after forward): one all-gather and one reduce-scatter per group
  with parameters (each block, the root) a step: the padded shard, and dp of them (shapes.py);
- clipping (world > 1): one world all-reduce of (2 + world) float64 (norm, loss, every rank's RSS).
Links as the accounting names them (layout.node_of: node = pp rank): "i->j" for p2p, "i->i" for a
collective inside node i, "span" for one across nodes; recvs are not counted on links.
"""
from __future__ import annotations

from simcluster.core.config import TrainRun
from simcluster.train.plan.shapes import F32, shard_table
from simcluster.train.split import split_layers, stage_ids

TP_ALL_REDUCES_PER_BLOCK = 4  # 2 forward + 2 backward (train/parallel.py TP_PLAN, SEED_TP_PLAN)


def act_bytes(run: TrainRun) -> int:
    """Bytes of one microbatch's hidden states (forward) or of their grads (backward) at a stage boundary."""
    per_seq = run.config.seq_len * run.model.dim if run.model.kind == "llama" else run.model.dim
    return run.microbatch_size * per_seq * F32


def stage_owner(run: TrainRun, stage: int) -> int:
    """The pp rank holding a global stage (inverse of split.stage_ids)."""
    return next(r for r in range(run.mesh.pp) if stage in stage_ids(r, run.mesh.pp, run.local_stages, run.layout))


def _add(out: dict, kind: str, nbytes: int, messages: int, link: str | None) -> None:
    if not messages:
        return
    out["bytes"][kind] = out["bytes"].get(kind, 0) + nbytes
    out["messages"][kind] = out["messages"].get(kind, 0) + messages
    if link is not None:
        out["links"][link] = out["links"].get(link, 0) + nbytes


def rank_traffic(run: TrainRun, rank: int) -> dict:
    """One rank's steady step in the accounting's shape: {"bytes": {kind: int}, "messages":
    {kind: int}, "links": {link: int}}, kinds and links with no traffic left out
    (train.traffic.summarize of the step's records)."""
    mesh, m = run.mesh, run.config.microbatches
    pp_rank = mesh.coords(rank)[0]
    out: dict = {"bytes": {}, "messages": {}, "links": {}}
    if mesh.world_size == 1:
        return out
    act, inside = act_bytes(run), f"{pp_rank}->{pp_rank}"
    layers = split_layers(run.model.n_layers, run.n_stages)
    for s in stage_ids(pp_rank, mesh.pp, run.local_stages, run.layout):
        for peer_stage in (s + 1, s - 1):
            if 0 <= peer_stage < run.n_stages and (peer := stage_owner(run, peer_stage)) != pp_rank:
                _add(out, "pp_send", m * act, m, f"{pp_rank}->{peer}")
                _add(out, "pp_recv", m * act, m, None)
        if mesh.tp > 1:
            n = TP_ALL_REDUCES_PER_BLOCK * len(layers[s]) * m
            _add(out, "tp_all_reduce", n * act, n, inside)
        if mesh.dp > 1:
            groups: dict[str, int] = {}
            for sh in shard_table(run, rank, stage=s):
                groups[sh.group] = groups.get(sh.group, 0) + sh.padded
            shard = sum(groups.values()) * F32
            _add(out, "fsdp_all_gather", shard, len(groups), inside)
            _add(out, "fsdp_reduce_scatter", mesh.dp * shard, len(groups), inside)
    _add(out, "world_all_reduce", (2 + mesh.world_size) * 8, 1, "span" if mesh.pp > 1 else "0->0")
    return out
