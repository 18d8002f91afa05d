"""Facts of a simulated cluster that the host side and the containers share (stdlib only).

    python -c "from simcluster.launcher.container.layout import EXIT_KEY, lost_after_s; print(EXIT_KEY, lost_after_s(300))"

One home for: the rendezvous service, the keys of its store, the lost-after rule, the default ports, mounts and join timeout. The
host side (launcher/engines/, launcher/observe/follow.py) and the programs inside the containers
(launcher/container/) import them from here; the containers are told the rest by flags.
"""
from __future__ import annotations

import os

RDZV_HOST = "rendezvous"  # service, host name and MASTER_ADDR of the rendezvous container
RDZV_PORT = 29400  # TCP port of its store inside the cluster network
NETWORK = "cluster"  # the compose network (internal: nothing published on the host)
RUNS_MOUNT = "/runs"  # run folders are mounted at /runs/<run name> in every container
DATA_MOUNT = "/data"  # data paths are mounted read-only at /data/<name>
CODE_DIR = "/code"  # the user's code folder, mounted read-only (launcher/job/entry.py)
WORK_DIR = "work"  # RUN_DIR/work: the working directory of your code's ranks (launcher/container/workdir.py)
APP_DIR = "/app"  # the project code inside the trainer image: APP_DIR/simcluster/{launcher,train}
# the trainer image; SIMCLUSTER_IMAGE names another tag (as images/build.sh reads it): several checkouts
# on one engine, each testing its own code in its own image
IMAGE = os.environ.get("SIMCLUSTER_IMAGE") or "simcluster/trainer:latest"
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


def lost_after_s(timeout_s: float) -> float:
    """Seconds of silence after which a node is lost: LOST_FRACTION x the job's timeout (s)."""
    return round(float(timeout_s) * LOST_FRACTION, 3)


# Inter-node network shaping (see docs in launcher/shaping.py): a helper container of this image,
# sharing a node's network namespace with NET_ADMIN, runs the tc command below on the node's
# eth0; the launcher then writes the node's marker file, which the node wrapper waits for
# before it starts its ranks (so the limit holds from the first collective).
SHAPED_DIR = ".network"  # in the run folder: <node>.ready markers (the tc readback inside)


def shaped_marker(run_dir: str, node: str) -> str:
    """The marker file of ``node`` under a run folder (host path or the containers' /runs/<name>)."""
    return f"{run_dir}/{SHAPED_DIR}/{node}.ready"
