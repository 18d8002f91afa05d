"""The launch description: one cluster job, resolved once at the edge, frozen, passed everywhere.

    python -c "from simcluster.launcher.job.entry import resolve_training; from simcluster.launcher.job.launch import NodeOptions; from simcluster.core.config import Config; \
print(resolve_training(Config(mesh='2x2x2', model='tiny'), NodeOptions()))"

``launcher/cli.py`` turns the flags into a Launch (``launcher/job/entry.py``: the built-in trainer or
the user's own code, one mesh parse); ``launcher/engines/compose/render.py`` turns a Launch into a compose
document; ``launcher/engines/compose/run.py`` runs it. Nothing downstream re-parses the mesh, the generated YAML or
another program's argv.
"""
from __future__ import annotations

import dataclasses
import posixpath
import math
import re
from dataclasses import dataclass
from functools import cached_property

from simcluster.launcher.job.checks import MIN_CPUS, image_problem, memory_problem
from simcluster.core.units import tc_rate_problem
from simcluster.launcher.job.deps import Requirements
from simcluster.launcher.job.sections import RDZV_BACKENDS, EngineOptions, NodeOptions  # noqa: F401 (a Launch's)
from simcluster.launcher.instrument.spec import Instruments
from simcluster.launcher.container.layout import CODE_DIR, RUNS_MOUNT, WORK_DIR, lost_after_s
from simcluster.launcher.job.files import run_name
from simcluster.core.layout import host_names, node_names, placement
from simcluster.core.layout import format_ranks, node_ranks
from simcluster.core.config import MeshSpec, TrainRun

MAX_ID = 2**31 - 1  # a uid or gid Docker's runtime takes (runc's libcontainer/user maxId)


def check_node_options(node: NodeOptions) -> list[str]:
    """Problems of the node options, each naming the option and a fix (the rules of sizes and
    image references: launcher/job/checks.py)."""
    errors = []
    if node.cpus_per_node is not None and not (node.cpus_per_node >= MIN_CPUS and math.isfinite(node.cpus_per_node)):
        errors.append(f"cpus_per_node: must be >= {MIN_CPUS} CPUs (Docker: 'Range of CPUs is from 0.01 to N.00'), "
                      f"got {node.cpus_per_node}; e.g. --cpus-per-node 2")
    if node.memory_per_node is not None and (why := memory_problem(node.memory_per_node)):
        errors.append(f"memory_per_node: {why}")
    if why := image_problem(node.image):
        errors.append(f"image: {node.image!r} is not an image reference: {why}; e.g. --image simcluster/trainer:latest "
                      f"or --image registry.example.com/me/trainer:1")
    if node.rdzv_backend not in RDZV_BACKENDS:
        errors.append(f"rdzv_backend: choose one of {', '.join(RDZV_BACKENDS)}, got {node.rdzv_backend!r}")
    if not (node.join_timeout_s > 0 and math.isfinite(node.join_timeout_s)):
        errors.append(f"join_timeout_s: must be > 0 seconds, got {node.join_timeout_s}; e.g. --join-timeout-s 120")
    if node.inter_node_bandwidth is not None and (why := tc_rate_problem("--inter-node-bandwidth",
                                                                          node.inter_node_bandwidth)):
        errors.append(f"inter_node_bandwidth: {why}")
    if node.inter_node_latency is not None:
        errors.append(f"inter_node_latency: {node.inter_node_latency!r} cannot be applied: this machine's kernel "
                      f"has no netem qdisc (tc answers 'Specified qdisc kind is unknown'), the only way to add "
                      f"delay; drop --inter-node-latency (--inter-node-bandwidth RATE works, with tc tbf)")
    if not re.fullmatch(r"[0-9]+:[0-9]+", node.user):
        errors.append(f"user: {node.user!r} is not UID:GID; e.g. --user 1000:1000")
    elif max(int(x) for x in node.user.split(":")) > MAX_ID:
        errors.append(f"user: {node.user!r} is beyond the ids a container runs as (0 to {MAX_ID} each; Docker "
                      f"answers 'uids and gids must be in range 0-{MAX_ID}'); e.g. --user 1000:1000")
    return errors


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"  # a host name's part; a path part: distribution/reference's
REGISTRY = re.compile(rf"({_LABEL}(\.{_LABEL})+(:[0-9]+)?|{_LABEL}:[0-9]+|localhost)(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_engine_options(eng: EngineOptions) -> list[str]:
    """Problems of the engine options, each naming the option and a fix: --runs-claim is a
    Kubernetes object name (a DNS-1123 subdomain: lowercase a-z, 0-9, '-' and '.', at most 253);
    --container-image and --workdir hold no whitespace (pyxis takes no such image; sbatch's
    ``#SBATCH --chdir`` line is split at whitespace)."""
    errors = []
    if not (DNS_SUBDOMAIN.fullmatch(eng.runs_claim) and len(eng.runs_claim) <= 253):
        errors.append(f"runs_claim: {eng.runs_claim!r} is not a Kubernetes object name (lowercase letters, digits, "
                      f"'-' and '.', starting and ending alphanumeric); e.g. --runs-claim simcluster-runs")
    if eng.container_image is not None and (not eng.container_image or re.search(r"\s", eng.container_image)):
        errors.append(f"container_image: {eng.container_image!r} is empty or holds whitespace; e.g. "
                      f"--container-image nvcr.io#nvidia/pytorch:24.05-py3")
    elif eng.container_image is not None and "://" in eng.container_image:
        errors.append(f"container_image: {eng.container_image!r} has a scheme, which pyxis does not take (it reads "
                      f"[USER@][REGISTRY#]IMAGE[:TAG] or a squashfs path); e.g. --container-image "
                      f"nvcr.io#nvidia/pytorch:24.05-py3")
    if eng.push is not None and not REGISTRY.fullmatch(eng.push):
        errors.append(f"push: {eng.push!r} is not a registry (a host with a dot or a port, or localhost, then "
                      f"optional path parts; no scheme); e.g. --push registry.example.com:5000 or --push ghcr.io/me")
    elif eng.push is not None and (port := re.match(r"[^/]*:([0-9]+)(/|$)", eng.push)) and not 0 < int(port[1]) < 65536:
        errors.append(f"push: {eng.push!r} names port {port[1]}, and a TCP port is 1 to 65535; e.g. --push "
                      f"localhost:5000")
    if eng.workdir is not None and (not eng.workdir or re.search(r"\s", eng.workdir)):
        errors.append(f"workdir: {eng.workdir!r} is empty or holds whitespace; e.g. --workdir /shared/me/simcluster")
    if eng.inter_host_bandwidth is not None and (why := tc_rate_problem("--inter-host-bandwidth",
                                                                         eng.inter_host_bandwidth)):
        errors.append(f"inter_host_bandwidth: {why}")
    if eng.inter_host_bandwidth is not None and (eng.hosts or 0) < 2:
        none = "there are none (no --hosts)" if eng.hosts is None else f"one host has none (--hosts {eng.hosts})"
        errors.append(f"inter_host_bandwidth: shapes the links between rehearsal hosts, and {none}; add "
                      f"--target swarm --hosts 2, or use --inter-node-bandwidth on one engine")
    return errors


@dataclass(frozen=True)
class Mount:
    """A bind mount of every node: host source (as the compose file names it: repo-relative
    POSIX or absolute), container target (absolute), mode "ro" or "rw"."""

    source: str
    target: str
    mode: str = "ro"


@dataclass(frozen=True)
class Launch:
    """One job on a simulated cluster: nnodes containers of nproc_per_node ranks each.

    mesh: the (pp, dp, tp) mesh when the job is 3D (nnodes = pp, nproc_per_node = dp*tp).
    module / script: what each rank runs, ``python -m MODULE`` or ``python SCRIPT`` (a container
        path); exactly one is set. argv: its arguments inside a node.
    run_dir: the host run folder (repo-relative POSIX or absolute), mounted read-write at
        /runs/<run name>: the job's output folder ($SIMCLUSTER_OUTPUT_DIR).
    mounts: further bind mounts (data, the user's code, --mount).
    timeout_s: the job's timeout (s): a peer silent for lost_after_s of it is lost.
    train: the built-in trainer's resolved run (None for the user's own code).
    restart: the launcher's restart count ($SIMCLUSTER_RESTART_COUNT): 0, then 1, 2, ...
    engine: options of the real engines' documents (EngineOptions).
    requirements: your code's dependencies (launcher/job/deps.py); the nodes run the image they derive
        (engines/deps_image.py with_image: node.image replaced before the engine renders or starts).
    env: (KEY, VALUE) pairs every rank of the job gets in its environment (``--env``; job/env.py).
    instruments: what the ranks of the user's code record (launcher/instrument/spec.py); unused
        by the built-in trainer, which takes its own flags.
    hosts_up: the rehearsal hosts (``--hosts N``) the nodes are placed on, node k on hosts_up[k mod
        len]: () for all N; after a host was lost, those left (a restart, engines/swarm/rehearse.py).
    """

    nnodes: int
    nproc_per_node: int
    mesh: MeshSpec | None
    module: str | None
    script: str | None
    argv: tuple[str, ...]
    run_dir: str
    mounts: tuple[Mount, ...]
    timeout_s: float
    node: NodeOptions
    train: TrainRun | None = None
    restart: int = 0
    engine: EngineOptions = EngineOptions()
    instruments: Instruments = Instruments()
    requirements: Requirements = Requirements()
    env: tuple[tuple[str, str], ...] = ()
    hosts_up: tuple[str, ...] = ()

    @cached_property
    def names(self) -> list[str]:
        """Service names of the nodes, node rank order."""
        return node_names(self.nnodes)

    @cached_property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @cached_property
    def run_name(self) -> str:
        return run_name(self.run_dir)

    @cached_property
    def output_dir(self) -> str:
        """The run folder inside the containers."""
        return f"{RUNS_MOUNT}/{self.run_name}"

    @cached_property
    def workdir(self) -> str | None:
        """The ranks' working directory in the containers: RUN_DIR/work for your code, writable and shared
        by every node as a cluster's (launcher/container/workdir.py); None for the built-in trainer (the
        image's /app)."""
        return None if self.train is not None else f"{self.output_dir}/{WORK_DIR}"

    @cached_property
    def code_dir(self) -> str | None:
        """Where your code folder is mounted in the containers (read-only), or None (a module of the image)."""
        return CODE_DIR if any(m.target == CODE_DIR for m in self.mounts) else None

    @cached_property
    def lost_after_s(self) -> float:
        return lost_after_s(self.timeout_s)

    @cached_property
    def job_name(self) -> str:
        """Names the default run folder and compose file: ``mesh-2x2x2`` for the built-in trainer,
        ``<script or module>-mesh-2x2x2`` or ``<script or module>-nodes-2x4`` for other code."""
        shape = f"mesh-{self.mesh}" if self.mesh else f"nodes-{self.nnodes}x{self.nproc_per_node}"
        if self.train is not None:
            return shape
        entry = posixpath.splitext(posixpath.basename(self.script))[0] if self.script else self.module
        return f"{entry}-{shape}"

    def record(self) -> dict:
        """The job as RUN_DIR/job.json keeps it (simcluster/core/runlog.py write_job, read_job): each node's ranks,
        the ranks a node, the world size, the image every node runs, the last step where it is known
        (the trainer's steps, your code's total_steps) and, on rehearsal hosts, each node's host
        (simcluster/core/layout.py placement)."""
        out = {"nodes": {name: format_ranks(node_ranks(k, self.nproc_per_node)) for k, name in enumerate(self.names)},
               "nproc_per_node": self.nproc_per_node, "world_size": self.world_size, "image": self.node.image}
        steps = self.train.config.steps if self.train is not None else self.instruments.total_steps
        if steps is not None:
            out["steps"] = steps  # the run's last step, where known (`chaos` refuses a step after it at once)
        if self.node_hosts:
            out["hosts"] = dict(zip(self.names, self.node_hosts))
        return out

    @cached_property
    def node_hosts(self) -> list[str] | None:
        """Node k's rehearsal host, for every k (``up --hosts``; simcluster/core/layout.py placement over hosts_up, or
        over every host), or None on one engine."""
        if not self.engine.hosts:
            return None
        return list(placement(self.nnodes, list(self.hosts_up) or host_names(self.engine.hosts)).values())

    @cached_property
    def shape(self) -> str:
        """``mesh 2x2x2`` or ``2 node(s) x 4 rank(s)``, for messages."""
        return f"mesh {self.mesh}" if self.mesh else f"{self.nnodes} node(s) x {self.nproc_per_node} rank(s)"

    @cached_property
    def layout(self) -> str:
        """The shape with the nodes and ranks a mesh means: ``mesh 2x2x2 = 2 node(s) x 4 rank(s)``, or
        ``2 node(s) x 2 rank(s)`` (what `up` says as it starts)."""
        nodes = f"{self.nnodes} node(s) x {self.nproc_per_node} rank(s)"
        return f"mesh {self.mesh} = {nodes}" if self.mesh else nodes


def with_resume(launch: Launch, path: str) -> Launch:
    """The same launch with the trainer's --resume set to path (a container path)."""
    argv = list(launch.argv)
    if "--resume" in argv:
        i = argv.index("--resume")
        del argv[i:i + 2]
    return dataclasses.replace(launch, argv=(*argv, "--resume", path))


def restart_launch(launch: Launch, restart: int) -> Launch:
    """The launch of restart number ``restart`` (SIMCLUSTER_RESTART_COUNT): the built-in trainer
    resumes with ``--resume auto`` (the newest complete checkpoint of its run folder, or from the
    start: the same mechanism a torchrun restart uses); other code is told the count and resumes
    from its own files."""
    launch = dataclasses.replace(launch, restart=restart)
    return with_resume(launch, "auto") if launch.train is not None else launch
