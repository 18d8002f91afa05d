"""The launch description: one cluster job, resolved once at the edge, frozen, passed everywhere.

    python -c "from launcher.launch import *; from train.config import Config; \
print(resolve_training(Config(mesh='2x2x2', model='tiny'), NodeOptions()).argv)"

``launcher/cli.py`` turns the flags into a Launch (``resolve_training``: one mesh parse, one
preflight); ``launcher/compose.py`` turns a Launch into a compose document; ``runner.py`` runs
it. Nothing downstream re-parses the mesh, the generated YAML or another program's argv.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, fields

from launcher.layout import DATA_MOUNT, IMAGE, IMAGE_USER, JOIN_TIMEOUT_S, RUNS_MOUNT, lost_after_s, node_names, run_name
from train.config import Config, ConfigError, MeshSpec, TrainRun
from train.preflight import preflight

RDZV_BACKENDS = ("c10d", "static")


@dataclass(frozen=True)
class NodeOptions:
    """Container-level options, the same for every node.

    cpus_per_node: CPU limit of each node container (compose ``cpus``); None = no limit.
    memory_per_node: memory limit of each node container, e.g. "3g" (compose ``mem_limit``).
    image: the trainer image, built locally by images/build.sh (services carry ``pull_policy:
        never`` and no ``build``: the offline build needs build.sh's base image and wheelhouse).
    rdzv_backend: torchrun rendezvous, "c10d" (default) or "static"; see launcher/container/node.py.
    mount_code: bind-mount the host's train/ and launcher/ read-only over /app (development:
        runs the working tree without rebuilding the image).
    join_timeout_s: seconds after its start by which every node must have joined the rendezvous.
    torchrun: start each node's ranks with the stock torchrun CLI (a fresh interpreter per
        rank) instead of launcher.container.forkrun (torchrun's agent, ranks forked after one import).
    user: ``UID:GID`` the containers run as (``launcher up`` passes the invoking user's, unless root).
    """

    cpus_per_node: float | None = None
    memory_per_node: str | None = None
    image: str = IMAGE
    rdzv_backend: str = "c10d"
    mount_code: bool = False
    join_timeout_s: float = JOIN_TIMEOUT_S
    torchrun: bool = False
    user: str = IMAGE_USER


def check_node_options(node: NodeOptions, module: str) -> list[str]:
    """Problems of the node options and the entry module, each naming the option and a fix."""
    errors = []
    if node.cpus_per_node is not None and not (node.cpus_per_node > 0 and math.isfinite(node.cpus_per_node)):
        errors.append(f"cpus_per_node: must be > 0 CPUs, got {node.cpus_per_node}; e.g. --cpus-per-node 2")
    if node.memory_per_node is not None and not re.fullmatch(r"[1-9]\d*(\.\d+)?[bkmg]?", str(node.memory_per_node).lower()):
        errors.append(f"memory_per_node: {node.memory_per_node!r} is not a size; e.g. --memory-per-node 3g or 1536m")
    if node.rdzv_backend not in RDZV_BACKENDS:
        errors.append(f"rdzv_backend: choose one of {', '.join(RDZV_BACKENDS)}, got {node.rdzv_backend!r}")
    if not (node.join_timeout_s > 0 and math.isfinite(node.join_timeout_s)):
        errors.append(f"join_timeout_s: must be > 0 seconds, got {node.join_timeout_s}; e.g. --join-timeout-s 120")
    if not re.fullmatch(r"\d+:\d+", node.user):
        errors.append(f"user: {node.user!r} is not UID:GID; e.g. --user 1000:1000")
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        errors.append(f"module: {module!r} is not a Python module name; e.g. train or launcher.container.probe")
    return errors


@dataclass(frozen=True)
class Launch:
    """One job on a simulated cluster: nnodes containers of nproc_per_node ranks each.

    mesh: the (pp, dp, tp) mesh when the job is 3D (nnodes = pp, nproc_per_node = dp*tp).
    module: what each rank runs, ``python -m MODULE``; argv: its arguments inside a node (paths
        already rewritten to the mounts, /runs/<run name> and /data/<name>).
    run_dir: the host run folder (repo-relative POSIX or absolute), mounted at /runs/<run name>.
    data: a host data path (file or folder) mounted read-only at /data/<name>, or None.
    timeout_s: the job's timeout (s): a peer silent for lost_after_s of it is lost.
    train: the built-in trainer's resolved run (None for other code).
    """

    nnodes: int
    nproc_per_node: int
    mesh: MeshSpec | None
    module: str
    argv: tuple[str, ...]
    run_dir: str
    data: str | None
    timeout_s: float
    node: NodeOptions
    train: TrainRun | None = None

    @property
    def names(self) -> list[str]:
        """Service names of the nodes, node rank order."""
        return node_names(self.nnodes)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def run_name(self) -> str:
        return run_name(self.run_dir)

    @property
    def lost_after_s(self) -> float:
        return lost_after_s(self.timeout_s)

    @property
    def job_name(self) -> str:
        """``mesh-2x2x2``: names the default run folder and compose file."""
        return f"mesh-{self.mesh}"

    @property
    def shape(self) -> str:
        """``mesh 2x2x2`` or ``2 node(s) x 4 rank(s)``, for messages."""
        return f"mesh {self.mesh}" if self.mesh else f"{self.nnodes} node(s) x {self.nproc_per_node} rank(s)"


def _flag_value(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def train_flags(cfg: Config, mesh: MeshSpec, run: str, data: str | None) -> tuple[str, ...]:
    """The ``-m train`` flags inside a node: every Config field the user set (not None, not its
    default), with --mesh normalised, --run-dir /runs/<run> and --data /data/<name>; sorted by
    flag name, so the output is deterministic."""
    defaults = Config()
    values = {f.name: _flag_value(getattr(cfg, f.name)) for f in fields(Config)
              if getattr(cfg, f.name) is not None and getattr(cfg, f.name) != getattr(defaults, f.name)}
    values.update(mesh=str(mesh), run_dir=f"{RUNS_MOUNT}/{run}")
    if data is not None:
        values["data"] = f"{DATA_MOUNT}/{run_name(data)}"
    return tuple(x for name in sorted(values) for x in ("--" + name.replace("_", "-"), values[name]))


def resolve_training(cfg: Config, node: NodeOptions, module: str = "train", host_path=lambda p: p) -> Launch:
    """The Launch of a training run: preflight (the one mesh parse), run folder, mounts, flags.

    cfg: the user's options; its run_dir and data as host_path(p) will name them in the compose
        file (the CLI passes a function giving repo-relative or absolute paths). An unset run_dir
        is the one default rule of train.config.default_run_dir, relative to the repo root.
    module: "train", or another module given the same flags (launcher.container.probe).

    Raises:
        ConfigError: every problem of the config (preflight), the node options or the run folder.
    """
    run = preflight(cfg)
    errors = check_node_options(node, module)
    run_dir = host_path(cfg.run_dir) if cfg.run_dir is not None else run.config.run_dir
    if not run_name(run_dir):
        errors.append(f"run_dir: {cfg.run_dir!r} has no folder name; pass e.g. --run-dir runs/mesh-2x2x2")
    if errors:
        raise ConfigError("; ".join(errors))
    data = host_path(cfg.data) if cfg.data is not None else None
    argv = train_flags(cfg, run.mesh, run_name(run_dir), data)
    return Launch(nnodes=run.mesh.pp, nproc_per_node=run.mesh.ranks_per_node, mesh=run.mesh, module=module,
                  argv=argv, run_dir=run_dir, data=data, timeout_s=float(run.config.timeout_s), node=node, train=run)


def with_resume(launch: Launch, path: str) -> Launch:
    """The same launch with the trainer's --resume set to path (a container path)."""
    argv = list(launch.argv)
    if "--resume" in argv:
        i = argv.index("--resume")
        del argv[i:i + 2]
    return dataclasses.replace(launch, argv=(*argv, "--resume", path))
