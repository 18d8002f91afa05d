"""Docker Swarm target: a Launch -> the stack file that ``docker stack deploy`` runs on a swarm.

    python -m launcher generate --target swarm --mesh 2x2x2 --model tiny     # swarm/mesh-2x2x2.yml
    docker stack deploy --resolve-image never -c swarm/mesh-2x2x2.yml sc-swarm-mesh-2x2x2   # on a manager

The services are the Compose simulation's (launcher/engines/compose/render.py): ``rendezvous`` and one service
per node, ``node-0`` .. (zero-padded), each node running the node wrapper with torchrun's c10d
rendezvous. Stage placement: node-K's host name is its service name and c10d orders nodes by
sorted host name, which the zero padding makes node-rank order, so node K holds pipeline stage K
and ranks K*dp*tp .. (K+1)*dp*tp-1 (every node prints its host and coordinates; ``launcher up``
checks them). With ``--hosts N`` each node is pinned to a host by a placement constraint,
``node.hostname == host-K`` with K = k mod N (Launch.node_hosts: simcluster/core/layout.py placement), the
rendezvous with node 0. c10d and not the static rendezvous: a swarm has no per-node index of its own for
one service per node (``{{.Task.Slot}}`` numbers the replicas of one service, from 1), and the
rendezvous service also collects heartbeats and exit codes, which give ``launcher up`` its
summary, its exit code and the lost-node verdict on every engine the same way.

What the stack format changes against Compose (Docker 20.10's ``docker stack deploy`` rejects
``pull_policy``, ``cpus`` and ``mem_limit`` in a 3.8 file, ignores ``security_opt``, ``restart``
and ``depends_on``):
  - limits: ``deploy.resources.limits`` (``cpus``, ``memory``); ``--device cuda``: one
    ``NVIDIA-GPU`` generic resource per rank reserved (untested here: no GPU); no restarts by the engine:
    ``deploy.restart_policy.condition: none`` (each node runs once: the rendezvous records one exit
    per node; whole-job restarts are Compose's ``--max-restarts``);
  - pull_policy never: ``docker stack deploy --resolve-image never``, and the image must be on
    every host already (a registry, or ``docker save | docker load``);
  - depends_on: not needed: the node wrappers and torchrun retry the rendezvous until it answers;
  - security_opt no-new-privileges: the stack format cannot set it; ``cap_drop: [ALL]`` (an empty
    bounding set: a setuid binary gains no capability), a non-root user and a read-only root stay;
  - network: overlay, internal (no docker_gwbridge interface: eth0 is the only one, hence
    GLOO_SOCKET_IFNAME=eth0), attachable; ``endpoint_mode: dnsrr`` (a service name resolves to
    its task's address; virtual-IP endpoints need IPVS, which this machine's kernel lacks); no
    published ports; ``/tmp`` is a tmpfs mount.
Bind-mount sources: relative paths are resolved against project_dir (``..`` from swarm/*.yml,
which ``docker stack deploy`` resolves against the file's folder; or ``--workdir DIR``, the
checkout on shared storage, written absolute). On several hosts every host needs them at the
same absolute path (shared storage). Deterministic: the same Launch gives the same bytes.
"""
from __future__ import annotations

import posixpath
import shlex

from simcluster.launcher.job import files
from simcluster.launcher.job.files import repo_path
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import LABEL, NETWORK, RDZV_HOST
from simcluster.launcher.engines.compose.render import host_path, node_service, node_volumes, rendezvous_command
from simcluster.launcher.engines.document import HEADER, dump_services, hardening
from simcluster.launcher.engines.gpus import gpus_per_node

VERSION = "3.8"  # the stack file format (endpoint_mode needs 3.3, tmpfs mounts 3.6)
GPU_KIND = "NVIDIA-GPU"  # --device cuda: the generic resource a GPU host advertises (docs/engines.md, Docker Swarm)


def stack_name(launch: Launch) -> str:
    """The stack's name: ``sc-swarm-<run name>`` (services ``sc-swarm-mesh-2x2x2_node-0``, ...)."""
    from simcluster.launcher.docker.handle import Handle

    return Handle.for_stack(launch.run_name).project


def _deploy(launch: Launch, node: bool, k: int = 0) -> dict:
    """The ``deploy`` key: DNS round-robin endpoint, no engine restarts, a node's limits; with --hosts N,
    node k pinned to host k mod N and the rendezvous to host-0 (``node.hostname`` constraints)."""
    out: dict = {"endpoint_mode": "dnsrr", "restart_policy": {"condition": "none"}}
    if launch.node_hosts:
        out["placement"] = {"constraints": [f"node.hostname == {launch.node_hosts[k]}"]}
    limits = {}
    if node and launch.node.cpus_per_node is not None:
        limits["cpus"] = f"{launch.node.cpus_per_node:g}"
    if node and launch.node.memory_per_node is not None:
        limits["memory"] = str(launch.node.memory_per_node).lower()
    # the built-in trainer's --device cuda only: your code's ranks get the simulated GPUs of the node wrapper
    # (a stack runs here on a one-node swarm, which advertises no GPU)
    gpus = gpus_per_node(launch) if node and launch.train is not None else 0
    if limits or gpus:
        out["resources"] = {"limits": limits} if limits else {}
    if gpus:  # swarm's only GPU request: a generic resource each host advertises (daemon.json node-generic-resources)
        out["resources"]["reservations"] = {"generic_resources": [{"discrete_resource_spec": {"kind": GPU_KIND,
                                                                                              "value": gpus}}]}
    return out


def _hardening(user: str) -> dict:
    """Compose's hardening less what the stack format cannot set (see above): /tmp becomes a tmpfs
    mount (TMP), and no-new-privileges has no stack key."""
    return {k: v for k, v in hardening(user).items() if k not in ("tmpfs", "security_opt")}


TMP = {"type": "tmpfs", "target": "/tmp"}


def build(launch: Launch, project_dir: str) -> dict:
    """The stack document (a dict in fixed key order).

    project_dir: what relative host paths are joined to: ".." for swarm/*.yml (the stack CLI
        resolves relative bind sources against the file's folder), or an absolute folder.
    """
    node = launch.node
    code = ([f"{host_path(project_dir, repo_path(src))}:{dst}:ro" for src, dst in files.code_mounts()]
            if node.mount_code else [])
    services: dict[str, dict] = {
        RDZV_HOST: {
            "image": node.image,
            "hostname": RDZV_HOST,
            "command": rendezvous_command(launch),
            "environment": {"PYTHONUNBUFFERED": "1", "HOME": "/tmp"},
            "volumes": [*code, TMP],
            "networks": [NETWORK],
            "labels": {LABEL + "run-dir": launch.run_dir},
            **_hardening(node.user),
            "deploy": _deploy(launch, node=False),
        }
    }
    volumes = node_volumes(launch, project_dir, [*code, TMP])
    for k, name in enumerate(launch.names):
        services[name] = node_service(launch, k, volumes, {}, {},
                                      {**_hardening(node.user), "deploy": _deploy(launch, node=True, k=k)})
    network = {"driver": "overlay", "internal": True, "attachable": True}
    return {"version": VERSION, "services": services, "networks": {NETWORK: network}}


def render(launch: Launch, command: str, file: str, project_dir: str) -> str:
    """The stack file's text (``$`` escaped as ``$$``: the stack CLI interpolates variables too)
    under a header with the commands that run it; stack_file as typed from the repo root."""
    q = shlex.quote
    stack = stack_name(launch)
    run = host_path(project_dir, launch.run_dir) if posixpath.isabs(project_dir) else launch.run_dir
    header = HEADER.format(module="swarm/render", command=command) + (
        f"# Run on a swarm manager, from the repo root: mkdir -p {q(run)} && sudo chown {launch.node.user} {q(run)}\n"
        f"#   docker stack deploy --resolve-image never -c {q(file)} {stack}\n"
        f"#   docker service logs -f {stack}_{launch.names[0]}    # rank 0's step lines\n"
        f"#   docker stack rm {stack}    # when every task is Complete (docker stack ps {stack})\n"
        "# On several hosts: the image and the run folder on every host, at the same path (docs/engines.md, Docker Swarm).\n")
    return header + dump_services(build(launch, project_dir))
