"""SkyPilot engine: a Launch -> a SkyPilot task (``sky launch``), rendered here, run by SkyPilot on a cloud or
Kubernetes cluster with GPUs.

    python -m launcher generate --target skypilot --nodes 2 --nproc-per-node 4 --module mypkg.train \
        --image registry.example.com/me/trainer:1 --stdout
    sky launch -c sc skypilot/mypkg.train-nodes-2x4.yaml     # from the project checkout (the task's workdir)

``num_nodes`` NNODES; ``resources``: the GPU job's ``accelerators`` (engines/gpus.py: the --gpu model,
else the simulated default, one per rank), ``image_id: docker:IMAGE`` (the image rehearsed here, or
the one --push named: it must name a registry), the CPUs and memory per node as lower bounds
(``8+``, ``3+`` GB); ``workdir: .`` (SkyPilot syncs the folder ``sky launch`` runs in to every node,
and the run folder and data paths are relative to it); ``envs`` the node environment; ``setup`` the
run folder made (after --setup's line, when given); ``run`` stock torchrun with the static
rendezvous: ``--node-rank $SKYPILOT_NODE_RANK``, ``--master-addr`` the first line of
``$SKYPILOT_NODE_IPS`` (the head node), ``--nnodes $SKYPILOT_NUM_NODES`` and, for a GPU job,
``--nproc-per-node $SKYPILOT_NUM_GPUS_PER_NODE`` (SkyPilot's own variables), so node k holds ranks
k*nproc .. (k+1)*nproc-1 and pipeline stage k. tests/test_targets.py validates the task with
SkyPilot's own schemas (the pinned package's sky/utils/schemas.py).
"""
from __future__ import annotations

import math
import re
import shlex

from simcluster.launcher.engines.base import RenderOnly
from simcluster.core.flightrec import DUMP_DIR, dump_env
from simcluster.launcher.engines.document import HEADER, MASTER_PORT, Block, dump, host_argv, k8s_name, node_env, torchrun_argv
from simcluster.launcher.engines.gpus import gpu_job, skypilot_accelerator
from simcluster.launcher.job.launch import Launch

NODE_RANK, NODE_IPS, NUM_NODES, GPUS = ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES",
                                        "SKYPILOT_NUM_GPUS_PER_NODE")


def memory_gb(memory: str) -> str:
    """A compose-style size (``3g``, ``1536m``) in whole GB, rounded up, as SkyPilot's ``memory`` takes it."""
    m = re.fullmatch(r"([0-9.]+)([bkmg]?)", str(memory).lower())
    scale = {"b": 1 / 2**30, "k": 1 / 2**20, "m": 1 / 1024, "g": 1, "": 1 / 2**30}[m.group(2)]
    return str(max(1, math.ceil(float(m.group(1)) * scale)))


def resources(launch: Launch) -> dict:
    """The task's resources: accelerators (a GPU job), image_id, CPUs and memory at least (each node's)."""
    out = {}
    if accelerators := skypilot_accelerator(launch):
        out["accelerators"] = accelerators
    out["image_id"] = f"docker:{launch.node.image}"
    if launch.node.cpus_per_node is not None:
        out["cpus"] = f"{max(1, math.floor(launch.node.cpus_per_node))}+"
    if launch.node.memory_per_node is not None:
        out["memory"] = f"{memory_gb(launch.node.memory_per_node)}+"
    return out


def run_script(launch: Launch) -> str:
    """The task's ``run``: the head node's IP, then torchrun with SkyPilot's node rank (each argument quoted)."""
    nproc = f'"${GPUS}"' if gpu_job(launch) else str(launch.nproc_per_node)
    argv = torchrun_argv(launch, f'"${NODE_RANK}"', '"$MASTER_ADDR"', host_argv(launch))
    argv[argv.index("--nnodes") + 1], argv[argv.index("--nproc-per-node") + 1] = f'"${NUM_NODES}"', nproc
    line = " ".join(a if a.startswith('"$') or a.isdigit() else shlex.quote(a) for a in argv)
    return "\n".join([f'MASTER_ADDR=$(echo "${NODE_IPS}" | head -n 1)  # the head node: the rendezvous',
                      f"export MASTER_ADDR SIMCLUSTER_NODE=${NODE_RANK}",
                      f"exec {line}", ""])


def build(launch: Launch) -> dict:
    """The SkyPilot task (key order as SkyPilot's docs write it)."""
    # the Flight Recorder's dump on timeout into the run folder (core/flightrec.py); your --env wins
    env = {**dump_env(launch.run_dir), **node_env(launch, instruments=False), "MASTER_PORT": str(MASTER_PORT)}
    setup = [launch.engine.setup] if launch.engine.setup else []
    folder = f"mkdir -p {shlex.quote(launch.run_dir)}/{DUMP_DIR}"  # the run folder and its dumps' folder
    return {"name": k8s_name(launch), "num_nodes": launch.nnodes, "resources": resources(launch), "workdir": ".",
            "envs": env, "setup": Block("\n".join([*setup, folder, ""])),
            "run": Block(run_script(launch))}


class SkyPilot(RenderOnly):
    """The SkyPilot engine: rendered here (``generate --target skypilot``), run with ``sky launch``."""

    name = "skypilot"
    reads = frozenset({"setup"})
    default_path = "skypilot/{job}.yaml"
    tool = "sky"
    how = "sky launch -c sc skypilot/mesh-2x2x2.yaml, sky queue sc, sky logs sc, sky down sc"

    def registry_image(self, launch: Launch, local: bool) -> tuple[str, str] | None:
        """--image: SkyPilot pulls it on every node (image_id docker:IMAGE)."""
        return None if local else ("--image", launch.node.image)

    def render(self, launch: Launch, command: str, out_path: str, project_dir: str) -> str:
        """The task's YAML under a header naming command (out_path, project_dir: unused, no bind mounts)."""
        return (HEADER.format(module="skypilot", command=command) + "# Launch (from the project checkout, the task's "
                f"workdir): sky launch -c {k8s_name(launch)} {out_path}\n" + dump(build(launch)))
