"""Pure core: a Launch -> the compose document of one cluster, and its YAML text.

No I/O, no Docker, no torch: the same Launch always gives the same bytes.

    python -c "from simcluster.launcher.engines.compose.render import render; from simcluster.launcher.job.entry import resolve_training; \
from simcluster.launcher.job.launch import NodeOptions; from simcluster.core.config import Config; \
print(render(resolve_training(Config(mesh='2x2x2'), NodeOptions()), 'python -m launcher generate', 'compose/x.yml', '..'))"

Layout: service ``rendezvous`` (a TCPStore that also collects every node's exit code, then
exits) and one service per node ``node-0`` .. ``node-{N-1}`` (zero-padded, so sorted names
are node ranks; see launcher/container/layout.py), each running nproc_per_node ranks under torchrun.
Why c10d here when the real engines (launcher/engines/) use the static rendezvous with the
engine's node index: the rendezvous container serves the c10d store and the fault drills'
heartbeats and exit reports, and restarts re-run a c10d round; c10d ignores --node-rank and
orders nodes by host name, which the zero padding makes node-rank order.
Node env (see node_env): MASTER_ADDR=rendezvous, MASTER_PORT, GLOO_SOCKET_IFNAME=eth0 (the only
network), OMP_NUM_THREADS (see omp_threads), PYTHONUNBUFFERED=1, HOME=/tmp (any uid works), the
SIMCLUSTER_* contract; torchrun then gives each worker RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, TORCHELASTIC_* and its own MASTER_ADDR/MASTER_PORT.
"""
from __future__ import annotations

import posixpath
import shlex

from simcluster.launcher.job import files
from simcluster.launcher.job.files import repo_path
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import APP_DIR, LABEL, NETWORK, RDZV_HOST, RDZV_PORT, shaped_marker
from simcluster.core.layout import format_ranks, node_ranks
from simcluster.launcher.engines.document import HEADER, dump_services, hardening
from simcluster.launcher.engines.document import node_env as common_env


def omp_threads(cpus_per_node: float | None, ranks_per_node: int) -> int:
    """OMP_NUM_THREADS per rank: the node's CPUs split over its ranks, at least 1.

    Without a CPU limit it is 1: the nodes share the host's cores, so more threads per rank
    would only oversubscribe them (the trainer's --threads still overrides it).
    """
    if cpus_per_node is None:
        return 1
    return max(1, int(cpus_per_node // ranks_per_node))


def host_path(project_dir: str, path: str) -> str:
    """A compose bind-mount source: absolute paths as they are, others under project_dir.

    Always starts with ``.`` or ``/`` (a bare name would be read as a named volume).
    """
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    joined = posixpath.normpath(posixpath.join(project_dir, path))
    return joined if joined.startswith((".", "/")) else "./" + joined


def rendezvous_command(launch: Launch) -> list[str]:
    """The command of the rendezvous service: the store, the heartbeat watch and the exit reports."""
    return ["python", "-m", "simcluster.launcher.container.rendezvous", "--port", str(RDZV_PORT), "--nnodes",
            str(launch.nnodes), "--lost-after-s", repr(launch.lost_after_s), "--join-timeout-s",
            repr(float(launch.node.join_timeout_s))]


def node_command(launch: Launch, k: int) -> list[str]:
    """The command of node k: the node wrapper with everything it needs as its own flags, then
    ``--`` and the entry's arguments. The ranks are forked after one import per node
    (train/forkrun.py), the user's code's as the built-in trainer's, unless the
    node options ask for stock torchrun (``--torchrun``)."""
    node = launch.node
    entry = ["--module", launch.module] if launch.module else ["--script", launch.script]
    cmd = ["python", "-m", "simcluster.launcher.container.node", "--nnodes", str(launch.nnodes), "--node-rank", str(k),
           "--nproc-per-node", str(launch.nproc_per_node), "--rdzv-endpoint", f"{RDZV_HOST}:{RDZV_PORT}",
           "--rdzv-backend", node.rdzv_backend, "--run-id", launch.run_name, *entry,
           "--run-dir", launch.output_dir, "--lost-after-s", repr(launch.lost_after_s),
           "--join-timeout-s", repr(float(node.join_timeout_s))]
    if node.inter_node_bandwidth:
        cmd += ["--wait-for", shaped_marker(launch.output_dir, launch.names[k])]
    if launch.workdir:
        cmd += ["--workdir", launch.workdir]
    if launch.code_dir:
        cmd += ["--code-dir", launch.code_dir]
    if node.torchrun:
        cmd.append("--torchrun")
    return [*cmd, "--", *launch.argv]


def node_env(launch: Launch, k: int) -> dict[str, str]:
    """Environment of node k's container: the standard settings and the SIMCLUSTER_* contract
    (docs/own-code.md): SIMCLUSTER_NODE (k), SIMCLUSTER_NNODES, SIMCLUSTER_OUTPUT_DIR (the
    run folder, shared with the host), SIMCLUSTER_RESTART_COUNT (the launcher's restarts; a
    restart is a fresh cluster, so torchrun's TORCHELASTIC_RESTART_COUNT stays 0) and, for a
    mesh, SIMCLUSTER_PP, SIMCLUSTER_DP, SIMCLUSTER_TP."""
    env = {
        "MASTER_ADDR": RDZV_HOST,
        "MASTER_PORT": str(RDZV_PORT),
        "GLOO_SOCKET_IFNAME": "eth0",
        **common_env(launch, omp_threads(launch.node.cpus_per_node, launch.nproc_per_node)),
        "HOME": "/tmp",
        "SIMCLUSTER_HOST_RUN_DIR": launch.run_dir,  # named in the wrapper's "not writable" fix
        "SIMCLUSTER_NODE": str(k),
        "SIMCLUSTER_OUTPUT_DIR": launch.output_dir,
        "SIMCLUSTER_RESTART_COUNT": str(launch.restart),
    }
    if launch.workdir:
        env["PYTHONPATH"] = APP_DIR  # the user's folder first (the script's or the cwd), the image's code after
    return env


def node_volumes(launch: Launch, project_dir: str, code: list) -> list:
    """A node's bind mounts (``SRC:DST:MODE``, sources under project_dir): the run folder, the job's mounts,
    then code (this checkout's code with --mount-code, read-only)."""
    volumes = [f"{host_path(project_dir, launch.run_dir)}:{launch.output_dir}:rw"]
    volumes += [f"{host_path(project_dir, m.source)}:{m.target}:{m.mode}" for m in launch.mounts]
    return volumes + list(code)


def node_service(launch: Launch, k: int, volumes: list, head: dict, middle: dict, tail: dict) -> dict:
    """Node k's service, the one home of what Compose and Swarm (swarm/render.py) both write: image,
    hostname, command, environment, volumes, the cluster network, labels (node rank, ranks, run folder);
    each engine's own keys go at head (after the image), middle (before the labels) and tail (at the
    end), in that order in the document."""
    name = launch.names[k]
    return {
        "image": launch.node.image,
        **head,
        "hostname": name,
        "command": node_command(launch, k),
        "environment": node_env(launch, k),
        "volumes": list(volumes),
        "networks": [NETWORK],
        **middle,
        "labels": {LABEL + "node-rank": str(k),
                   LABEL + "ranks": format_ranks(node_ranks(k, launch.nproc_per_node)),
                   LABEL + "run-dir": launch.run_dir},
        **tail,
    }


def build_compose(launch: Launch, project_dir: str) -> dict:
    """The compose document (a dict in fixed key order) of one cluster.

    project_dir: path from the compose file's folder to the repo root ("." for the root
        docker-compose.yml, ".." for compose/*.yml, absolute if outside the repo); every
        relative bind-mount source is resolved against it.
    """
    node = launch.node
    code_mounts = []
    if node.mount_code:
        code_mounts = [f"{host_path(project_dir, repo_path(src))}:{dst}:ro" for src, dst in files.code_mounts()]
    services: dict[str, dict] = {
        RDZV_HOST: {
            "image": node.image,
            "pull_policy": "never",
            "hostname": RDZV_HOST,
            "command": rendezvous_command(launch),
            "environment": {"PYTHONUNBUFFERED": "1", "HOME": "/tmp"},
            **({"volumes": code_mounts} if code_mounts else {}),
            "networks": [NETWORK],
            "labels": {LABEL + "run-dir": launch.run_dir, LABEL + "nnodes": str(launch.nnodes),
                       LABEL + "nproc-per-node": str(launch.nproc_per_node)},
            **hardening(node.user),
        }
    }
    volumes = node_volumes(launch, project_dir, code_mounts)
    limits = {}
    if node.cpus_per_node is not None:
        limits["cpus"] = node.cpus_per_node
    if node.memory_per_node is not None:
        limits["mem_limit"] = str(node.memory_per_node).lower()
    for k, name in enumerate(launch.names):
        services[name] = node_service(launch, k, volumes, {"pull_policy": "never"}, {"depends_on": [RDZV_HOST]},
                                      {**limits, **hardening(node.user)})
    return {"services": services, "networks": {NETWORK: {"internal": True}}}


def render_yaml(doc: dict, command: str, compose_file: str, run_dir: str, user: str) -> str:
    """The compose document as YAML text (``$`` escaped), under a header naming the command that
    made it and how to run it (compose_file and run_dir as typed from the repo root)."""
    q = shlex.quote
    header = HEADER.format(module="compose/render", command=command) + (
        f"# Run: mkdir -p {q(run_dir)} && sudo chown {user} {q(run_dir)}    # the containers' user\n"
        f"#      docker compose -f {q(compose_file)} up --exit-code-from rendezvous    # or docker-compose; ends\n"
        "#      by itself, exit 0 only if every node exited 0.  Or: python -m launcher up (logs, progress, summary)\n"
    )
    return header + dump_services(doc)


def render(launch: Launch, command: str, file: str, project_dir: str) -> str:
    """The text of launch's compose file at file (as typed from the repo root), whose folder
    reaches the repo root by project_dir; command is the header's regenerate line."""
    return render_yaml(build_compose(launch, project_dir), command, file, launch.run_dir, launch.node.user)
