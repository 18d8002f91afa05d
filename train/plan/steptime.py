"""The predicted step time of a plan on a hardware model, with its parts per rank.

    python -m launcher plan --mesh 2x2x2 --model small --hardware h100-sxm-8x

Per rank, in seconds:
- compute: its forward and backward FLOPs (predict.RankPlan.flops) / the hardware's FLOP/s;
- communication: every message of its step (train/plan/traffic.py) on the ring algorithm's cost
  (Thakur et al., "Optimization of Collective Communication Operations in MPICH", 2005): an
  all-reduce over n ranks 2(n-1) latencies + 2(n-1)/n of its bytes / bandwidth, an all-gather
  (n-1) latencies + (n-1) x its shard / bandwidth, a reduce-scatter (n-1) latencies + (n-1)/n of its
  input / bandwidth, a send one latency + its bytes / bandwidth; the step's sum over the world
  (clipping's) is an all-reduce over tp, then dp, then pp (train/clip.py). The bandwidth is the node's
  (intra) when the group's ranks share a node of the hardware (8 GPUs; on ``local`` a pp stage,
  as the Compose cluster places them), else the network's (inter). None of it overlaps compute:
  all of it is exposed (an upper bound on CUDA, where NCCL streams overlap FSDP's prefetch);
- bubble: (compute + communication) x b / (1 - b), b the plan's bubble (torch's order on a FLOP clock);
- optimizer: fused AdamW and clipping touch 8 float32 per parameter element (read param, grad, 2
  moments and the grad again for the norm; write param and moments) at the memory bandwidth.
The step is the slowest rank's sum. On ``local``, where every rank shares the machine's cores,
the order is run instead (shared_step_time): a rank waiting leaves its core to the others. Two
rules of that machine: a rank's CPU is its FLOPs' time times its pp stage's measured overhead
(measure.stage_overhead: DTensor's dispatch, FSDP's copies, the pipelining runtime, the wake-ups
of its gloo groups' idle event loops), and a collective's calls and bytes are CPU too: gloo
between processes of one host copies (and reduces) them through the kernel. Each rank of a group of k spends hw.collective_cpu's measured line of
CPU on each call (calibrate.collective_cpu: per call and per byte, each kind and group size,
the ranks outnumbering the cores: several times what its bytes at the ping-pong's bandwidth
would take, BENCHMARKS.md); its latencies are a wait off the cores.
Left out: kernel efficiency (peaks are datasheet peaks),
mixed precision, overlap on CUDA streams, launch overheads, the data loader.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcluster.core.layout import mesh_groups, node_of
from simcluster.core.config import MeshSpec
from simcluster.core.hardware import Hardware
from simcluster.train.plan.predict import Plan, RankPlan
from simcluster.train.plan.schedule import rank_orders, shared_window
from simcluster.train.plan.shapes import stage_cost

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


def _bandwidth(ranks: tuple[int, ...], per_node: int, hw: Hardware, senders: int = 1) -> float:
    """Bytes/s one rank gets among ``ranks``: the node's link when they share a node of the hardware,
    else the network's; ``senders`` ranks of a node sending at once split a ``node_link``."""
    per = hw.ranks_per_node or per_node
    if len({node_of(r, per) for r in ranks}) == 1:
        return hw.intra_bw
    return hw.inter_bw / (senders if hw.node_link else 1)


def _ring_all_reduce(k: int) -> tuple[int, float]:
    return 2 * (k - 1), 2 * (k - 1) / k


# kind -> (latencies, bytes on the wire per byte the accounting records), a ring over k ranks
RING = {"tp_all_reduce": _ring_all_reduce, "world_all_reduce": _ring_all_reduce,
        "fsdp_all_gather": lambda k: (k - 1, k - 1), "fsdp_reduce_scatter": lambda k: (k - 1, (k - 1) / k)}
GROUP = {"tp_all_reduce": "tp", "world_all_reduce": "world", "fsdp_all_gather": "dp", "fsdp_reduce_scatter": "dp"}


def _ring_s(ring, messages: int, nbytes: int, ranks: tuple[int, ...], per_node: int, hw: Hardware) -> float:
    """Seconds of ``messages`` collectives of ``ring`` (a RING entry) over ``ranks`` carrying ``nbytes`` in all."""
    latencies, wire = ring(len(ranks))
    return messages * latencies * hw.latency_s + wire * nbytes / _bandwidth(ranks, per_node, hw, len(ranks))


def comm_parts(rank: int, traffic: dict, mesh: MeshSpec, hw: Hardware) -> dict[str, float]:
    """Seconds of each kind of one rank's messages in a step (traffic: the accounting's record,
    train/plan/traffic.py), priced as the module docstring's ring model prices them."""
    groups = mesh_groups(rank, mesh.pp, mesh.dp, mesh.tp)
    b, n, per, out = traffic["bytes"], traffic["messages"], mesh.ranks_per_node, {}
    for kind, ring in RING.items():
        if kind == "world_all_reduce" and b.get(kind):  # the sum over the world: tp, dp, then pp (train/clip.py)
            out[kind] = sum(_ring_s(ring, n[kind], b[kind], groups[d], per, hw) for d in ("tp", "dp", "pp") if d in groups)
        elif b.get(kind) and GROUP[kind] in groups:
            out[kind] = _ring_s(ring, n[kind], b[kind], groups[GROUP[kind]], per, hw)
    if b.get("pp_send"):
        out["pp_send"] = 0.0
        for link, nbytes in traffic["links"].items():  # "i->j": simulated nodes (pp stages); "span": the world's
            if link != "span" and (ends := tuple(map(int, link.split("->"))))[0] != ends[1]:
                peer = rank + (ends[1] - ends[0]) * per
                out["pp_send"] += send_s(nbytes / b["pp_send"] * n["pp_send"], nbytes, (rank, peer), mesh, hw)
    return out


def collective_cpu_s(kind: str, k: int, messages: int, nbytes: int, hw: Hardware) -> float:
    """CPU seconds each of a group's k ranks spends in ``messages`` calls of a kind carrying
    ``nbytes`` in all (the accounting's bytes): hw.collective_cpu's line for that kind at the
    largest measured group size k' <= k (its per-call part scaled by (k - 1) / (k' - 1), its
    per-byte part by the ring's bytes at k over those at k'); without one (k below every measured
    size), twice the ring's bytes at hw.intra_bw (a core copies each byte sent and each received)."""
    wire = RING[kind](k)[1]
    rows = [(m, a, b) for kind_, m, a, b in hw.collective_cpu if kind_ == kind and m <= k]
    if not rows:
        return 2 * wire * nbytes / hw.intra_bw
    m, per_call, per_byte = max(rows)
    return messages * per_call * (k - 1) / (m - 1) + nbytes * per_byte * wire / RING[kind](m)[1]


def send_s(messages: float, nbytes: float, pair: tuple[int, int], mesh: MeshSpec, hw: Hardware) -> float:
    """Seconds of a rank's sends to its peer in another pp stage (pair: the two global ranks): one
    latency each, the bytes at its share of the link (on a ``node_link`` the node's ranks send at
    once: a pp stage's ranks move in step)."""
    return messages * hw.latency_s + nbytes / _bandwidth(pair, mesh.ranks_per_node, hw, mesh.ranks_per_node)


INSIDE = ("tp_all_reduce", "fsdp_all_gather", "fsdp_reduce_scatter")  # the collectives inside an action


def send_bytes(traffic: dict) -> float:
    """Bytes one pp send of a rank carries (its step's pp_send bytes over its messages; F sends
    activations, B/I input grads: the same shape); 0 without sends."""
    n = traffic["messages"].get("pp_send", 0)
    return traffic["bytes"].get("pp_send", 0) / n if n else 0.0


def send_pair(kind: str, stage: int, rank_of: dict[int, int], mesh: MeshSpec) -> tuple[int, int]:
    """(sender, receiver): the first global ranks of the pp ranks holding ``stage`` and the stage
    an F (stage + 1) or a B/I (stage - 1) sends to; the sender twice where there is no such stage."""
    to = stage + 1 if kind == "F" else stage - 1
    return rank_of[stage] * mesh.ranks_per_node, rank_of.get(to, rank_of[stage]) * mesh.ranks_per_node


def communication_s(r: RankPlan, p: Plan, hw: Hardware) -> float:
    """Seconds of every message of one rank's step (comm_parts summed)."""
    return sum(comm_parts(r.rank, r.traffic, p.run.mesh, hw).values())


def step_time(p: Plan, hw: Hardware, overhead: tuple[float, ...] | None = None) -> tuple[StepTime, list[StepTime]]:
    """(the slowest rank's StepTime, every rank's); on hardware whose ranks share cores (local),
    shared_step_time's (one StepTime per pp stage: its dp x tp ranks move alike), with
    ``overhead`` if given (per pp rank, measure.stage_overhead's CPU per FLOP-model second)."""
    if hw.shared_cores:
        return shared_step_time(p, hw, overhead)
    out = []
    for r in p.ranks:
        compute, comm = r.flops / hw.flops, communication_s(r, p, hw)
        bubble = (compute + comm) * p.bubble / (1 - p.bubble) if p.bubble < 1 else 0.0
        out.append(StepTime(r.rank, compute, comm, bubble, 8 * r.params / hw.memory_bw))
    return max(out, key=lambda s: s.total), out


def shared_step_time(p: Plan, hw: Hardware, overhead: tuple[float, ...] | None = None,
                     ) -> tuple[StepTime, list[StepTime]]:
    """The step on cores every rank shares: torch's order run by schedule.shared_window, each
    action needing its stage's FLOPs / hw.flops of one core (hw.shared_flops while every core is
    busy), times its pp rank's ``overhead`` where one is given (measured with as many ranks at
    once as the job has, so then at hw.flops), plus its FLOPs' share of the CPU of the rank's TP
    and FSDP collectives (collective_cpu_s), and then waiting, off the cores, for their latencies
    (hw.latency_s, or hw.shared_latency_s where the ranks outnumber the cores); sends on the
    node's link.
    compute: the seconds the stage's ranks ran (sharing the cores) but for their copying's share;
    communication: that copying, those waits and the world all-reduce; bubble: the rest of the
    window."""
    run, mesh = p.run, p.run.mesh
    latency = hw.latency_s if mesh.world_size <= hw.shared_cores else hw.shared_latency_s
    at = dataclasses.replace(hw, latency_s=latency)
    orders = rank_orders(run.config.schedule, mesh.pp, run.config.microbatches, run.local_stages)
    rank_of = {s: r for r, order in enumerate(orders) for _, s, _ in order}
    firsts = [p.ranks[pp * mesh.ranks_per_node] for pp in range(mesh.pp)]  # one rank a pp stage
    parts = [comm_parts(r.rank, r.traffic, mesh, at) for r in firsts]
    work, wait, sends, shares = {}, {}, {}, []
    for pp, r in enumerate(firsts):
        groups, n = mesh_groups(r.rank, mesh.pp, mesh.dp, mesh.tp), r.traffic["messages"]
        sizes = {k: len(groups[GROUP[k]]) for k in INSIDE if r.traffic["bytes"].get(k)}  # the kinds it runs
        inside = latency * sum(n[k] * RING[k](size)[0] for k, size in sizes.items())  # their latencies
        copying = sum(collective_cpu_s(k, size, n[k], r.traffic["bytes"][k], hw) for k, size in sizes.items())
        scale = overhead[pp] if overhead else 1.0
        for s in r.stages:
            c = stage_cost(run, s)
            for kind, flops in (("F", c.fwd_flops), ("B", c.bwd_flops), ("I", c.bwd_flops / 2), ("W", c.bwd_flops / 2)):
                # r.flops: the rank's step, so each action copies its FLOPs' share of the step's bytes
                work[(kind, s)] = scale * flops / hw.flops + copying * flops / r.flops
                wait[(kind, s)] = inside / len(orders[pp])
                sends[(kind, s)] = send_s(1, send_bytes(r.traffic), send_pair(kind, s, rank_of, mesh), mesh, at)
        shares.append(copying / (copying + scale * r.flops / hw.flops))
    window, ran = shared_window(orders, work, wait, sends if mesh.pp > 1 else None, mesh.ranks_per_node,
                                hw.shared_cores, 1.0 if overhead else (hw.shared_flops or hw.flops) / hw.flops)
    out = []
    for pp, r in enumerate(firsts):
        waits = sum(wait[(kind, s)] for kind, s, _ in orders[pp])
        copied = ran[pp] * shares[pp]  # the running seconds spent copying collectives' bytes
        out.append(StepTime(r.rank, ran[pp] - copied, copied + waits + parts[pp].get("world_all_reduce", 0.0),
                            max(0.0, window - ran[pp] - waits), 8 * r.params / hw.memory_bw))
    return max(out, key=lambda s: s.total), out


def to_text(slowest: StepTime, hw: Hardware, overhead: tuple[float, ...] | None = None) -> str:
    """The step time line and its parts, the hardware's sources (and the measured overhead of each
    pp stage, where given) and what the model leaves out."""
    s = slowest
    lines = [f"step time on {hw.name}: {1e3 * s.total:.2f} ms (rank {s.rank}, the slowest): compute "
             f"{1e3 * s.compute:.2f}, exposed communication {1e3 * s.communication:.2f}, bubble {1e3 * s.bubble:.2f}, "
             f"optimizer {1e3 * s.optimizer:.2f} ms"]
    lines += [f"  source: {src}" for src in hw.sources]
    if overhead:
        lines.append("  source: each pp stage's CPU a step, measured on the fake process group, as many ranks at once "
                     "as the job has: " + ", ".join(f"x{o:.2f}" for o in overhead) + " its FLOPs' time (train/plan/measure.py)")
    lines.append(f"  left out: {LEFT_OUT}")
    return "\n".join(lines)
