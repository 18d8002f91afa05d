"""Facts of a simulated cluster that the host side and the containers share (stdlib only).

    python -c "from simcluster.launcher.layout import node_names, node_ranks; print(node_names(12)[:3], node_ranks(1, 4))"

One home for: the names of services and nodes, which global ranks a node holds, the keys of
the rendezvous store, the lost-after rule, the default ports, mounts and join timeout. The
host side (launcher/compose.py, runner.py, follow.py) and the programs inside the containers
(launcher/container/) import them from here; the containers are told the rest by flags.
"""
from __future__ import annotations


RDZV_HOST = "rendezvous"  # service, host name and MASTER_ADDR of the rendezvous container
RDZV_PORT = 29400  # TCP port of its store inside the cluster network
NETWORK = "cluster"  # the compose network (internal: nothing published on the host)
RUNS_MOUNT = "/runs"  # run folders are mounted at /runs/<run name> in every container
DATA_MOUNT = "/data"  # data paths are mounted read-only at /data/<name>
APP_DIR = "/app"  # the project code inside the trainer image: APP_DIR/simcluster/{launcher,train}
TRAINER_MODULE = "simcluster.train"  # the built-in trainer, as torchrun -m runs it on every rank
IMAGE = "simcluster/trainer:latest"
LABEL = "io.simcluster."  # prefix of the containers' and the image's labels: what `launcher status` reads back
IMAGE_USER = "1000:1000"  # the image's own user, for compose files and a launcher run as root
JOIN_TIMEOUT_S = 300.0  # every node must have joined the rendezvous this long after its start
LOST_FRACTION = 0.4  # a node silent for this fraction of the job's timeout is lost
RUN_DIR_MODE = 0o755  # run folders: owned by the containers' user, this mode

# Keys of the rendezvous store (launcher/container/rendezvous.py serves them, node.py writes them).
REPORTED = "simcluster/reported"  # counter, incremented by each reporting node
EXIT_KEY = "simcluster/exit/"  # + node name: JSON {"node", "node_rank", "ranks", "exit_code", "reason", "waits"}
NODE_KEY = "simcluster/node/"  # + node rank: JSON {"node", "node_rank", "ranks", "nproc"} on joining
HB_KEY = "simcluster/hb/"  # + node rank: counter bumped about every second by the node's wrapper
VERDICT = "simcluster/verdict"  # JSON {"lost": [{"node", "node_rank", "ranks", "reason"}], "message"}
FINISHED = "simcluster/finished"  # set once the verdict is final: heartbeats stop, the rendezvous exits soon
CLOSED_KEY = "simcluster/closed/"  # + node rank: set by a node that read FINISHED, as it closes its store client
# The quiet end: a node whose exit report says "waits" stays until the rendezvous exits; its
# heartbeat reads FINISHED, sets CLOSED_KEY and drops its client; the rendezvous exits once every
# such node has (a few seconds at most), and the node notices by a plain TCP connection closing.


def report_key(index: int) -> str:
    """Store key holding the node name of the index-th exit report (1-based)."""
    return f"{REPORTED}/{index}"


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


def lost_after_s(timeout_s: float) -> float:
    """Seconds of silence after which a node is lost: LOST_FRACTION x the job's timeout (s)."""
    return round(float(timeout_s) * LOST_FRACTION, 3)


def run_name(run_dir: str) -> str:
    """Basename of a run folder: its mount name, the rendezvous id and the compose project's
    suffix (``runs/x/`` -> ``x``). Empty for a path with no folder name."""
    parts = [p for p in str(run_dir).replace("\\", "/").split("/") if p not in ("", ".")]
    return "" if not parts or parts[-1] == ".." else parts[-1]


# Inter-node network shaping (see docs in launcher/shaping.py): a helper container of this image,
# sharing a node's network namespace with NET_ADMIN, runs the tc command below on the node's
# eth0; the launcher then writes the node's marker file, which the node wrapper waits for
# before it starts its ranks (so the limit holds from the first collective).
SHAPED_DIR = ".network"  # in the run folder: <node>.ready markers (the tc readback inside)


def shaped_marker(run_dir: str, node: str) -> str:
    """The marker file of ``node`` under a run folder (host path or the containers' /runs/<name>)."""
    return f"{run_dir}/{SHAPED_DIR}/{node}.ready"
