"""Pure core: a Config plus node options -> the docker-compose document of one cluster.

No I/O, no Docker, no torch: the same inputs always give the same bytes.

    python -c "from launcher.compose import *; from train.config import Config; \
print(render_yaml(build_compose(Config(mesh='2x2x2'), NodeOptions(), '.'), 'python -m launcher generate'))"

Layout: service ``rendezvous`` (a TCPStore that also collects every node's exit code, then
exits) and one service per pipeline stage ``node-0`` .. ``node-{pp-1}`` (zero-padded to the
width of pp, so sorted names = node ranks), each running dp*tp ranks under torchrun.
Node env: MASTER_ADDR=rendezvous, MASTER_PORT, GLOO_SOCKET_IFNAME=eth0 (the only network),
OMP_NUM_THREADS (see omp_threads), PYTHONUNBUFFERED=1, SIMCLUSTER_HOST_RUN_DIR (for messages).
torchrun then gives each worker RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK and
its own MASTER_ADDR/MASTER_PORT (see launcher/node.py).
"""
from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass, fields

import yaml

from launcher.rendezvous import LOST_FRACTION

from train.config import Config, ConfigError, MeshSpec

IMAGE = "simcluster/trainer:latest"
RDZV_HOST = "rendezvous"
NETWORK = "cluster"
RUNS_MOUNT = "/runs"
DATA_MOUNT = "/data"
APP_DIR = "/app"  # project code inside the image
RDZV_BACKENDS = ("c10d", "static")


@dataclass(frozen=True)
class NodeOptions:
    """Container-level options, the same for every node.

    cpus_per_node: CPU limit of each node container (compose ``cpus``); None = no limit.
    memory_per_node: memory limit of each node container, e.g. "3g" (compose ``mem_limit``).
    image: the trainer image, built locally by images/build.sh. Services carry ``image`` and
        ``pull_policy: never`` but no ``build``: the offline build needs build.sh's base image
        and wheelhouse, and compose v1 would try to pull for the services without ``build``.
    rdzv_port: TCP port of the rendezvous store inside the cluster network.
    rdzv_backend: torchrun rendezvous, "c10d" (default) or "static"; see launcher/node.py.
    module: what torchrun runs (``-m MODULE``): "train", or "launcher.probe" to test wiring.
    mount_code: bind-mount the host's train/ and launcher/ read-only over /app (development:
        runs the working tree without rebuilding the image).
    join_timeout_s: seconds after the rendezvous starts by which every node must have joined,
        else the job ends naming the missing node(s); None = the rendezvous default (300 s).
    torchrun: start each node's ranks with the stock torchrun CLI (a fresh interpreter per
        rank) instead of launcher.forkrun (torchrun's agent, ranks forked after one import).
    """

    cpus_per_node: float | None = None
    memory_per_node: str | None = None
    image: str = IMAGE
    rdzv_port: int = 29400
    rdzv_backend: str = "c10d"
    module: str = "train"
    mount_code: bool = False
    join_timeout_s: float | None = None
    torchrun: bool = False


def check_node_options(node: NodeOptions) -> list[str]:
    """Problems of a NodeOptions, each naming the option and a fix; empty when fine."""
    errors = []
    if node.cpus_per_node is not None and not (node.cpus_per_node > 0 and math.isfinite(node.cpus_per_node)):
        errors.append(f"cpus_per_node: must be > 0 CPUs, got {node.cpus_per_node}; e.g. --cpus-per-node 2")
    if node.memory_per_node is not None and not re.fullmatch(r"[1-9]\d*(\.\d+)?[bkmg]?", str(node.memory_per_node).lower()):
        errors.append(f"memory_per_node: {node.memory_per_node!r} is not a size; e.g. --memory-per-node 3g or 1536m")
    if not 1 <= node.rdzv_port <= 65535:
        errors.append(f"rdzv_port: must be in 1..65535, got {node.rdzv_port}")
    if node.rdzv_backend not in RDZV_BACKENDS:
        errors.append(f"rdzv_backend: choose one of {', '.join(RDZV_BACKENDS)}, got {node.rdzv_backend!r}")
    if node.join_timeout_s is not None and not (node.join_timeout_s > 0 and math.isfinite(node.join_timeout_s)):
        errors.append(f"join_timeout_s: must be > 0 seconds, got {node.join_timeout_s}; e.g. --join-timeout-s 120")
    if not re.fullmatch(r"[A-Za-z_][\w.]*", node.module):
        errors.append(f"module: {node.module!r} is not a Python module name; e.g. train or launcher.probe")
    return errors


def node_names(pp: int) -> list[str]:
    """Service/host names of the pp nodes: node-0.. for pp < 10, node-00.. for pp >= 10.

    Every name has the width of pp, so sorting them gives node-rank order, which is what
    torchrun's c10d rendezvous sorts by to give out node ranks.
    """
    width = len(str(pp))
    return [f"node-{k:0{width}d}" for k in range(pp)]


def node_ranks(mesh: MeshSpec, node_rank: int) -> range:
    """Global ranks on node ``node_rank``: k*dp*tp .. (k+1)*dp*tp - 1 (one pp stage group)."""
    n = mesh.ranks_per_node
    return range(node_rank * n, (node_rank + 1) * n)


def format_ranks(ranks: range) -> str:
    """``0-3`` (or ``5`` for a single rank)."""
    return str(ranks.start) if len(ranks) == 1 else f"{ranks.start}-{ranks.stop - 1}"


def omp_threads(cpus_per_node: float | None, ranks_per_node: int) -> int:
    """OMP_NUM_THREADS per rank: the node's CPUs split over its ranks, at least 1.

    Without a CPU limit it is 1: the nodes share the host's cores, so more threads per rank
    would only oversubscribe them (the trainer's --threads still overrides it).
    """
    if cpus_per_node is None:
        return 1
    return max(1, int(cpus_per_node // ranks_per_node))


def run_name(run_dir: str) -> str:
    """Basename of the run folder, the rendezvous id and mount name (``runs/x/`` -> ``x``)."""
    name = posixpath.basename(posixpath.normpath(str(run_dir).replace("\\", "/")))
    if name in ("", ".", "..", "/"):
        raise ConfigError(f"run_dir: {run_dir!r} has no folder name; pass e.g. --run-dir runs/mesh-2x2x2")
    return name


def host_path(project_dir: str, path: str) -> str:
    """A compose bind-mount source: absolute paths as they are, others under project_dir.

    Always starts with ``.`` or ``/`` (a bare name would be read as a named volume).
    """
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    joined = posixpath.normpath(posixpath.join(project_dir, path))
    return joined if joined.startswith((".", "/")) else "./" + joined


def default_run_dir(mesh: MeshSpec) -> str:
    """Run folder of a generated file: ``runs/mesh-PPxDPxTP``."""
    return f"runs/mesh-{mesh}"


def default_compose_path(mesh: MeshSpec) -> str:
    """Where ``generate`` writes without --out, relative to the repo root."""
    return f"compose/mesh-{mesh}.yml"


def _flag_value(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def train_flags(cfg: Config) -> list[str]:
    """The ``-m train`` flags inside a node: every Config field that differs from its default,
    plus --mesh and --run-dir always; run_dir and data rewritten to their mount points.
    Sorted by flag name, so the output is deterministic.
    """
    defaults = Config()
    values: dict[str, str] = {}
    for f in fields(Config):
        value = getattr(cfg, f.name)
        if f.name in ("mesh", "run_dir", "data") or value is None or value == getattr(defaults, f.name):
            continue
        values[f.name] = _flag_value(value)
    values["mesh"] = str(cfg.mesh_spec())
    values["run_dir"] = f"{RUNS_MOUNT}/{run_name(cfg.run_dir)}"
    if cfg.data is not None:
        values["data"] = f"{DATA_MOUNT}/{run_name(cfg.data)}"
    out: list[str] = []
    for name in sorted(values):
        out += ["--" + name.replace("_", "-"), values[name]]
    return out


def rendezvous_fault_flags(cfg: Config, node: NodeOptions) -> list[str]:
    """Fault-detection flags of the rendezvous, only where they differ from its defaults (so the
    default file stays as it was): --lost-after-s = 0.4 x the trainer's timeout_s (a node silent
    that long is lost; the node wrappers derive the same from --timeout-s), --join-timeout-s."""
    flags = []
    if cfg.timeout_s != Config().timeout_s:
        flags += ["--lost-after-s", _flag_value(round(float(cfg.timeout_s) * LOST_FRACTION, 3))]
    if node.join_timeout_s is not None:
        flags += ["--join-timeout-s", _flag_value(float(node.join_timeout_s))]
    return flags


def _hardening() -> dict:
    """Security settings shared by every service (no ports are published anywhere)."""
    return {
        "user": "1000:1000",
        "read_only": True,
        "tmpfs": ["/tmp"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
    }


def build_compose(cfg: Config, node: NodeOptions, project_dir: str) -> dict:
    """The compose document (a dict in fixed key order) for one cluster.

    project_dir: path from the compose file's folder to the repo root ("." for the root
        docker-compose.yml, ".." for compose/*.yml, absolute if outside the repo); every
        relative bind-mount source is resolved against it.

    Raises:
        ConfigError: a bad mesh, run_dir or node option (no other preflight is done here).
    """
    errors = check_node_options(node)
    if errors:
        raise ConfigError("; ".join(errors))
    mesh = cfg.mesh_spec()
    run = run_name(cfg.run_dir)
    names = node_names(mesh.pp)
    endpoint = f"{RDZV_HOST}:{node.rdzv_port}"
    code_mounts = []
    if node.mount_code:
        code_mounts = [f"{host_path(project_dir, d)}:{APP_DIR}/{d}:ro" for d in ("train", "launcher")]

    services: dict[str, dict] = {
        RDZV_HOST: {
            "image": node.image,
            "pull_policy": "never",
            "hostname": RDZV_HOST,
            "command": ["python", "-m", "launcher.rendezvous", "--port", str(node.rdzv_port),
                        "--nnodes", str(mesh.pp)] + rendezvous_fault_flags(cfg, node),
            "environment": {"PYTHONUNBUFFERED": "1"},
            **({"volumes": code_mounts} if code_mounts else {}),
            "networks": [NETWORK],
            **_hardening(),
        }
    }
    volumes = [f"{host_path(project_dir, cfg.run_dir)}:{RUNS_MOUNT}/{run}:rw"]
    if cfg.data is not None:
        volumes.append(f"{host_path(project_dir, cfg.data)}:{DATA_MOUNT}/{run_name(cfg.data)}:ro")
    volumes += code_mounts
    env = {
        "MASTER_ADDR": RDZV_HOST,
        "MASTER_PORT": str(node.rdzv_port),
        "GLOO_SOCKET_IFNAME": "eth0",
        "OMP_NUM_THREADS": str(omp_threads(node.cpus_per_node, mesh.ranks_per_node)),
        "PYTHONUNBUFFERED": "1",
        "SIMCLUSTER_HOST_RUN_DIR": cfg.run_dir,  # named in the wrapper's "not writable" fix
    }
    limits = {}
    if node.cpus_per_node is not None:
        limits["cpus"] = node.cpus_per_node
    if node.memory_per_node is not None:
        limits["mem_limit"] = str(node.memory_per_node).lower()
    flags = train_flags(cfg)
    for k, name in enumerate(names):
        command = ["python", "-m", "launcher.node", "--nnodes", str(mesh.pp), "--node-rank", str(k),
                   "--nproc-per-node", str(mesh.ranks_per_node), "--rdzv-endpoint", endpoint,
                   "--rdzv-backend", node.rdzv_backend, "--run-id", run]
        if node.module != "train":
            command += ["--module", node.module]
        if node.join_timeout_s is not None:
            command += ["--join-timeout-s", _flag_value(float(node.join_timeout_s))]
        if node.torchrun:
            command += ["--torchrun"]
        services[name] = {
            "image": node.image,
            "pull_policy": "never",
            "hostname": name,
            "command": command + ["--"] + flags,
            "environment": dict(env),
            "volumes": list(volumes),
            "networks": [NETWORK],
            "depends_on": [RDZV_HOST],
            **limits,
            **_hardening(),
        }
    return {"services": services, "networks": {NETWORK: {"internal": True}}}


class _Flow(list):
    """A list dumped on one line (``[a, b]``): used for ``command``."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def render_yaml(doc: dict, command: str, compose_file: str = "<this file>", run_dir: str = "<run folder>") -> str:
    """The compose document as YAML text, under a header naming the command that made it and
    how to run it (compose_file and run_dir as the user types them from the repo root)."""
    header = (
        "# Generated by the simcluster launcher (launcher/compose.py); do not edit by hand.\n"
        f"# Regenerate (from the repo root): {command}\n"
        f"# Run: mkdir -p {run_dir} && chmod 1777 {run_dir}    # the nodes run as uid 1000\n"
        f"#      docker compose -f {compose_file} up    # or docker-compose; ends by itself, the rendezvous\n"
        "#      exits 0 only if every node did.  Or: python -m launcher up --mesh ... (logs, progress, summary)\n"
    )
    doc = {**doc, "services": {name: {k: _Flow(v) if k == "command" else v for k, v in svc.items()}
                               for name, svc in doc["services"].items()}}
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)

