"""The rank layout of a (pp, dp, tp) mesh on nodes: which node holds a rank, node names, each rank's groups.

    python -c "from simcluster.core.layout import node_names, node_ranks; print(node_names(12)[:3], node_ranks(1, 4))"

The lower floor's one home for these rules (stdlib only): the trainer, the planner and the launcher's
host side and containers import them from here. Node k holds pipeline stage k and the global ranks
k*nproc .. (k+1)*nproc - 1.
"""
from __future__ import annotations

TRAINER_MODULE = "simcluster.train"  # the built-in trainer, as torchrun -m runs it on every rank


def node_name(k: int, nnodes: int) -> str:
    """Service and host name of node rank k: ``node-K`` zero-padded to the width of nnodes, so
    sorted names are node-rank order (what torchrun's c10d rendezvous sorts by)."""
    return f"node-{k:0{len(str(nnodes))}d}"


def node_names(nnodes: int) -> list[str]:
    """Names of all nodes: node-0.. for fewer than 10, node-00.. for 10 to 99, and so on."""
    return [node_name(k, nnodes) for k in range(nnodes)]


def node_ranks(k: int, nproc: int) -> range:
    """Global ranks on node rank k with nproc ranks a node: k*nproc .. (k+1)*nproc - 1.

    With a (pp, dp, tp) mesh, nproc = dp*tp and node k holds pipeline stage k.
    """
    return range(k * nproc, (k + 1) * nproc)


def node_of(rank: int, nproc: int) -> int:
    """The node rank holding global rank ``rank`` with nproc ranks a node: rank // nproc (the
    inverse of node_ranks). The one rank-to-node rule, for the host side, the containers and the
    trainer alike; with a (pp, dp, tp) mesh it is the rank's pipeline stage (nproc = dp*tp)."""
    return rank // nproc


def mesh_groups(rank: int, pp: int, dp: int, tp: int) -> dict[str, tuple[int, ...]]:
    """This rank's groups of a (pp, dp, tp) mesh laid out pp-outermost, as ``init_device_mesh``
    lays out ``(pp, dp, tp)`` (rank = (pp_i*dp + dp_i)*tp + tp_i): {"pp", "dp", "tp", "world"} ->
    sorted global ranks; size-1 dimensions are left out (they never communicate)."""
    pp_i, rest = divmod(rank, dp * tp)
    dp_i, tp_i = divmod(rest, tp)
    out = {"world": tuple(range(pp * dp * tp))}
    if pp > 1:
        out["pp"] = tuple((p * dp + dp_i) * tp + tp_i for p in range(pp))
    if dp > 1:
        out["dp"] = tuple((pp_i * dp + d) * tp + tp_i for d in range(dp))
    if tp > 1:
        out["tp"] = tuple((pp_i * dp + dp_i) * tp + t for t in range(tp))
    return out


def format_ranks(ranks: range) -> str:
    """``0-3``, or ``5`` for a single rank."""
    return str(ranks.start) if len(ranks) == 1 else f"{ranks.start}-{ranks.stop - 1}"


def rank_range(k: int, nproc: int | None) -> str:
    """``"4-7"`` for node rank k with nproc ranks (``"5"`` for one, ``"?"`` if unknown)."""
    return format_ranks(node_ranks(k, nproc)) if nproc else "?"


def host_names(hosts: int) -> list[str]:
    """The rehearsal hosts of ``up --target swarm --hosts N``: host-0 (the swarm's manager and registry) ..
    host-N-1, the host names every engine reports (``node.hostname`` in placement constraints)."""
    return [f"host-{h}" for h in range(hosts)]


def host_of(k: int, hosts: list[str]) -> str:
    """The host node k runs on: hosts[k mod len(hosts)] (node 0 and the rendezvous on the first), as a
    user pins nodes with placement constraints. Raises ValueError: no hosts."""
    if not hosts:
        raise ValueError("host_of: no hosts to place node k on")
    return hosts[k % len(hosts)]


def placement(nnodes: int, hosts: list[str]) -> dict[str, str]:
    """node name -> host, for every node (host_of), e.g. {"node-0": "host-0", "node-1": "host-1"}."""
    return {name: host_of(k, hosts) for k, name in enumerate(node_names(nnodes))}
