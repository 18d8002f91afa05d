"""Traffic accounting: bytes and messages of every communication of a step, by kind and by link.

    torchrun --standalone --nproc-per-node 4 -m train --mesh 2x1x2 --model tiny --steps 3 --traffic 1
    cat runs/mesh-2x1x2/traffic/rank-0.jsonl

Facility: a ``TorchDispatchMode`` (``torch.utils._python_dispatch``), the mechanism torch's own
``CommDebugMode`` is built on, active only around a step when ``--traffic 1``. Every
communication of this code goes through the dispatcher as a c10d op on the calling thread:
pipeline ``c10d.send``/``c10d.recv_`` (``batch_isend_irecv``), DTensor's TP all-reduces
(``_c10d_functional.all_reduce``), FSDP2's ``c10d._allgather_base_`` and
``c10d._reduce_scatter_base_``, and clipping's sum over the world (``c10d.allreduce_`` over tp, dp,
then pp: one ``world_all_reduce`` record, ``TrafficMode.as_one``). The mode sees each
op with its tensors, its process group and, for p2p, the peer: all that bytes per link needs.
Not chosen: ``CommDebugMode`` itself counts ops but neither bytes, groups nor send/recv; the
flight recorder (``TORCH_FR_BUFFER_SIZE``) records gloo collectives but, in torch 2.13, no
send/recv; profiler records carry tensor shapes but neither the group nor the peer. Off, nothing
is installed (tests/test_traffic.py checks that no dispatch mode or profiler is active).

Per rank and step, each message is one op call. ``bytes`` is what this rank puts on the wire by
the op's contract, not gloo's internal algorithm: a send its tensor; a recv the tensor it
receives (counted apart, so a link's bytes are the senders'); an all-reduce or reduce-scatter
its whole input (the bytes it contributes); an all-gather its shard. Links: p2p ``"i->j"``
between nodes i, j (node = layout.node_of(rank, dp*tp); ``i->i`` inside a node); a collective whose ranks
all sit on one node ``"i->i"``; one spanning nodes (its per-link pattern is gloo's choice)
``"span"``.
"""
from __future__ import annotations

import contextlib

import json
import os

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from simcluster.core.layout import node_of

KINDS = ("pp_send", "pp_recv", "tp_all_reduce", "fsdp_all_gather", "fsdp_reduce_scatter", "world_all_reduce", "other")

_c10d, _funcol = torch.ops.c10d, torch.ops._c10d_functional
# op -> (name, position of its tensor(s), position of its group, position of its peer or None)
_OPS = {
    _c10d.send.default: ("send", 0, 1, 2),
    _c10d.recv_.default: ("recv", 0, 1, 2),
    _c10d.allreduce_.default: ("all_reduce", 0, 1, None),
    _c10d.broadcast_.default: ("broadcast", 0, 1, None),
    _c10d._allgather_base_.default: ("all_gather", 1, 2, None),
    _c10d.allgather_into_tensor_coalesced_.default: ("all_gather", 1, 2, None),
    _c10d._reduce_scatter_base_.default: ("reduce_scatter", 1, 2, None),
    _c10d.reduce_scatter_tensor_coalesced_.default: ("reduce_scatter", 1, 2, None),
    _funcol.all_reduce.default: ("all_reduce", 0, 2, None),
    _funcol.all_gather_into_tensor.default: ("all_gather", 0, 2, None),
    _funcol.reduce_scatter_tensor.default: ("reduce_scatter", 0, 3, None),
}


def _nbytes(t) -> int:
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _group_ranks(group) -> tuple[int, ...]:
    """Global ranks of a process group given as a ScriptObject, a ProcessGroup or a group name."""
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group
        group = _resolve_process_group(group)
    elif not isinstance(group, dist.ProcessGroup):
        group = dist.ProcessGroup.unbox(group)
    return tuple(dist.get_process_group_ranks(group))


class TrafficMode(TorchDispatchMode):
    """Records every communication op dispatched while active into ``self.records``.

    Args:
        rank: this process's global rank.
        ranks_per_node: dp*tp (launcher/container/layout.py node_of).
        kinds_by_group: "pp" | "dp" | "tp" | "world" -> this rank's groups as sorted global ranks:
            ``group_kinds(mesh)`` in the trainer, ``layout.mesh_groups`` for the user's code.
            Where two coincide (1x1x2: tp is the world) the op tells them apart
            (``collective_kind``). A send or recv whose peer is in this rank's pp group is
            ``pp_send``/``pp_recv`` whatever group carries it (hand-written pipelines use the
            world group), any other ``send``/``recv``.

    ``records``: list of dicts {kind, op, bytes, link}; ``take()`` returns and clears them.
    """

    def __init__(self, rank: int, ranks_per_node: int, kinds_by_group: dict[str, tuple[int, ...]]):
        super().__init__()
        self.rank, self.per_node, self.groups = rank, ranks_per_node, kinds_by_group
        self.records: list[dict] = []
        self._ranks_cache: dict[str, tuple[int, ...]] = {}

    def _ranks(self, group) -> tuple[int, ...]:
        # keyed by the group's name: ScriptObject boxes are made per call, their id() is reused
        if not isinstance(group, str):
            group = (group if isinstance(group, dist.ProcessGroup) else dist.ProcessGroup.unbox(group)).group_name
        if group not in self._ranks_cache:
            self._ranks_cache[group] = _group_ranks(group)
        return self._ranks_cache[group]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        spec = _OPS.get(func)
        if spec is not None:
            self._record(spec, args)
        return func(*args, **(kwargs or {}))

    def _record(self, spec, args) -> None:
        op, t_pos, g_pos, peer_pos = spec
        ranks = self._ranks(args[g_pos])
        node = node_of(self.rank, self.per_node)
        if peer_pos is not None:
            peer = ranks[args[peer_pos]]
            src, dst = (node, node_of(peer, self.per_node)) if op == "send" else (node_of(peer, self.per_node), node)
            link = f"{src}->{dst}"
            kind = "pp_" + op if peer != self.rank and peer in self.groups.get("pp", ()) else op
        else:
            nodes = {node_of(r, self.per_node) for r in ranks}
            link = f"{node}->{node}" if len(nodes) == 1 else "span"
            kind = collective_kind(op, spec[0] == "all_reduce" and g_pos == 2,
                                   {d for d, members in self.groups.items() if members == tuple(sorted(ranks))})
        self.records.append({"kind": kind, "op": op, "bytes": _nbytes(args[t_pos]), "link": link})

    @contextlib.contextmanager
    def as_one(self, kind: str):
        """Record the collectives issued inside as one ``kind`` record, of the first one's bytes,
        on its link if all share one, else "span": the trainer's sum over the world, issued as
        all-reduces over tp, dp then pp (train/clip.py), counts as the one world all-reduce it is."""
        start = len(self.records)
        try:
            yield
        finally:
            inner, self.records[start:] = self.records[start:], []
            if inner:
                links = {r["link"] for r in inner}
                link = links.pop() if len(links) == 1 else "span"
                self.records.append({"kind": kind, "op": "all_reduce", "bytes": inner[0]["bytes"], "link": link})

    def take(self) -> list[dict]:
        out, self.records = self.records, []
        return out


def collective_kind(op: str, functional: bool, dims: set[str]) -> str:
    """The kind of a collective: named after the mesh dimension its group is, else the op.

    op: all_reduce | all_gather | reduce_scatter | broadcast; functional: a ``_c10d_functional`` op (DTensor's);
    dims: the names ("pp", "dp", "tp", "world") whose ranks equal the op's group. Rules, first
    match: a functional all-reduce over tp is ``tp_all_reduce``; an all-gather or reduce-scatter
    over dp is ``fsdp_<op>``; a c10d all-reduce over the world is ``world_all_reduce``; else
    ``<dim>_<op>`` for the first of tp, dp, pp, world the group is; else ``<op>``.
    """
    if op == "all_reduce" and functional and "tp" in dims:
        return "tp_all_reduce"
    if op in ("all_gather", "reduce_scatter") and "dp" in dims:
        return "fsdp_" + op
    if op == "all_reduce" and not functional and "world" in dims:
        return "world_all_reduce"
    dim = next((d for d in ("tp", "dp", "pp", "world") if d in dims), None)
    return f"{dim}_{op}" if dim else op


def summarize(records: list[dict]) -> dict:
    """One rank's step: {"bytes": {kind: int}, "messages": {kind: int}, "links": {link: int}}.

    ``links`` sums the bytes sent (recvs excluded, so each p2p byte is counted once, by its sender).
    """
    out: dict = {"bytes": {}, "messages": {}, "links": {}}
    for r in records:
        out["bytes"][r["kind"]] = out["bytes"].get(r["kind"], 0) + r["bytes"]
        out["messages"][r["kind"]] = out["messages"].get(r["kind"], 0) + 1
        if r["op"] != "recv":
            out["links"][r["link"]] = out["links"].get(r["link"], 0) + r["bytes"]
    return out


def group_kinds(mesh) -> dict[str, tuple[int, ...]]:
    """This rank's mesh groups as sorted global ranks: {"pp", "dp", "tp", "world"} -> ranks.

    mesh: the (pp, dp, tp) DeviceMesh. Size-1 dims are left out (they never communicate).
    """
    out = {"world": tuple(range(dist.get_world_size()))}
    for name in ("pp", "dp", "tp"):
        if mesh[name].size() > 1:
            out[name] = tuple(sorted(dist.get_process_group_ranks(mesh[name].get_group())))
    return out


def link_names(pp: int) -> list[str]:
    """Every node link of a pp-node run, in a fixed order: "0->0", "0->1", ..., then "span"."""
    return [f"{i}->{j}" for i in range(pp) for j in range(pp)] + ["span"]


def world_totals(step_summary: dict, pp: int) -> dict:
    """Sum one step's per-rank summaries over the world (one all-reduce, issued outside the mode).

    Returns the same shape as ``summarize``, with every kind and link present (zeros included).
    Collective: call on all ranks.
    """
    links = link_names(pp)
    folded: dict = {"bytes": {}, "messages": {}}  # kinds outside KINDS count as "other"
    for part in folded:
        for k, v in step_summary[part].items():
            key = k if k in KINDS else "other"
            folded[part][key] = folded[part].get(key, 0) + v
    vec = torch.tensor([folded["bytes"].get(k, 0) for k in KINDS]
                       + [folded["messages"].get(k, 0) for k in KINDS]
                       + [step_summary["links"].get(l, 0) for l in links], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(vec)
    v = [int(x) for x in vec.tolist()]
    n = len(KINDS)
    return {"bytes": dict(zip(KINDS, v[:n])), "messages": dict(zip(KINDS, v[n:2 * n])),
            "links": dict(zip(links, v[2 * n:]))}


class TrafficLog:
    """Appends each step's per-rank summary to RUN_DIR/traffic/rank-R.jsonl."""

    def __init__(self, run_dir: str, rank: int, keep_until: int = 0):
        folder = os.path.join(run_dir, "traffic")
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"rank-{rank}.jsonl")
        if not keep_until and os.path.exists(self.path):
            os.remove(self.path)

    def write(self, step: int, summary: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, **summary}, sort_keys=True) + "\n")
