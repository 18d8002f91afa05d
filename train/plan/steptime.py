"""The predicted step time of a plan on a hardware model, with its parts per rank.

    python -m launcher plan --mesh 2x2x2 --model small --hardware h100-sxm-8x

Per rank, in seconds:
- compute: its forward and backward FLOPs (predict.RankPlan.flops) / the hardware's FLOP/s; on
  ``local`` the job's ranks share its cores, so a rank gets min(1, cores / world) of a core's;
- communication: every message of its step (train/plan/traffic.py) on the ring algorithm's cost
  (Thakur et al., "Optimization of Collective Communication Operations in MPICH", 2005): an
  all-reduce over n ranks 2(n-1) latencies + 2(n-1)/n of its bytes / bandwidth, an all-gather
  (n-1) latencies + (n-1) x its shard / bandwidth, a reduce-scatter (n-1) latencies + (n-1)/n of its
  input / bandwidth, a send one latency + its bytes / bandwidth. The bandwidth is the node's
  (intra) when the group's ranks share a node of the hardware (8 GPUs; on ``local`` a pp stage,
  as the Compose cluster places them), else the network's (inter). None of it overlaps compute:
  all of it is exposed (an upper bound on CUDA, where NCCL streams overlap FSDP's prefetch);
- bubble: (compute + communication) x b / (1 - b), b the plan's bubble (torch's order on a FLOP clock);
  on ``local`` with more ranks than cores, a rank waiting in the bubble leaves its core to another
  rank: min(1, ranks per node / cores) of the bubble is absorbed (all of it on 2x2x2 with 2 cores);
- optimizer: fused AdamW and clipping touch 8 float32 per parameter element (read param, grad, 2
  moments and the grad again for the norm; write param and moments) at the memory bandwidth.
The step is the slowest rank's sum. Left out: kernel efficiency (peaks are datasheet peaks),
mixed precision, overlap on CUDA streams, launch overheads, the data loader.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcluster.train.plan.hardware import Hardware
from simcluster.train.plan.predict import Plan, RankPlan

LEFT_OUT = "kernel efficiency (datasheet peaks), mixed precision, overlap of communication on CUDA streams, launch overheads"


@dataclass(frozen=True)
class StepTime:
    """Seconds of one rank's step by part; total their sum."""

    rank: int
    compute: float
    communication: float
    bubble: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.compute + self.communication + self.bubble + self.optimizer


def _node(rank: int, p: Plan, hw: Hardware) -> int:
    per = hw.ranks_per_node or p.run.mesh.ranks_per_node
    return rank // per


def _bandwidth(ranks: list[int], p: Plan, hw: Hardware) -> float:
    return hw.intra_bw if len({_node(r, p, hw) for r in ranks}) == 1 else hw.inter_bw


def _groups(rank: int, p: Plan) -> dict[str, list[int]]:
    """This rank's tp, dp and world groups as global ranks (train/config.py MeshSpec.coords)."""
    mesh = p.run.mesh
    base = rank - (rank % mesh.tp)
    tp = [base + i for i in range(mesh.tp)]
    first = rank - ((rank // mesh.tp) % mesh.dp) * mesh.tp
    dp = [first + i * mesh.tp for i in range(mesh.dp)]
    return {"tp": tp, "dp": dp, "world": list(range(mesh.world_size))}


def communication_s(r: RankPlan, p: Plan, hw: Hardware) -> float:
    """Seconds of every message of one rank's step, as the module docstring's ring model prices them."""
    groups, t = _groups(r.rank, p), 0.0
    b, n = r.traffic["bytes"], r.traffic["messages"]
    for kind, group in (("tp_all_reduce", "tp"), ("world_all_reduce", "world")):
        if kind in b:
            k = len(groups[group])
            t += n[kind] * 2 * (k - 1) * hw.latency_s + 2 * (k - 1) / k * b[kind] / _bandwidth(groups[group], p, hw)
    dp = len(groups["dp"])
    bw = _bandwidth(groups["dp"], p, hw)
    if "fsdp_all_gather" in b:
        t += n["fsdp_all_gather"] * (dp - 1) * hw.latency_s + (dp - 1) * b["fsdp_all_gather"] / bw
    if "fsdp_reduce_scatter" in b:
        t += n["fsdp_reduce_scatter"] * (dp - 1) * hw.latency_s + (dp - 1) / dp * b["fsdp_reduce_scatter"] / bw
    for link, nbytes in r.traffic["links"].items():  # the sends, by link: "i->j" between simulated nodes
        if link != "span" and "pp_send" in b:
            i, j = map(int, link.split("->"))
            if i != j:
                peer = r.rank + (j - i) * p.run.mesh.ranks_per_node
                share = nbytes / b["pp_send"]  # this link's part of the sends
                t += share * n["pp_send"] * hw.latency_s + nbytes / _bandwidth([r.rank, peer], p, hw)
    return t


def step_time(p: Plan, hw: Hardware) -> tuple[StepTime, list[StepTime]]:
    """(the slowest rank's StepTime, every rank's)."""
    world = p.run.mesh.world_size
    rate = hw.flops * (min(1.0, hw.shared_cores / world) if hw.shared_cores else 1.0)
    shared = hw.shared_cores and world > hw.shared_cores
    kept = 1 - min(1.0, p.run.mesh.ranks_per_node / hw.shared_cores) if shared else 1.0
    out = []
    for r in p.ranks:
        compute, comm = r.flops / rate, communication_s(r, p, hw)
        bubble = kept * (compute + comm) * p.bubble / (1 - p.bubble) if p.bubble < 1 else 0.0
        out.append(StepTime(r.rank, compute, comm, bubble, 8 * r.params / hw.memory_bw))
    return max(out, key=lambda s: s.total), out


def to_text(slowest: StepTime, hw: Hardware) -> str:
    """The step time line and its parts, the hardware's sources and what the model leaves out."""
    s = slowest
    lines = [f"step time on {hw.name}: {1e3 * s.total:.2f} ms (rank {s.rank}, the slowest): compute "
             f"{1e3 * s.compute:.2f}, exposed communication {1e3 * s.communication:.2f}, bubble {1e3 * s.bubble:.2f}, "
             f"optimizer {1e3 * s.optimizer:.2f} ms"]
    lines += [f"  source: {src}" for src in hw.sources]
    lines.append(f"  left out: {LEFT_OUT}")
    return "\n".join(lines)
