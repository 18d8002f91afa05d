"""The Kubernetes pod template of one node, shared by the JobSet and TrainJob engines.

    python -c "from simcluster.launcher.engines.pod import *; from simcluster.launcher.job.entry import resolve_training; \
from simcluster.launcher.job.launch import NodeOptions; from simcluster.core.config import Config; \
print(container(resolve_training(Config(mesh='2x2x2'), NodeOptions()), ['torchrun'], {}))"

One container ``node`` of the image, non-root (the image's user 1000), all capabilities dropped,
read-only root filesystem, /tmp an emptyDir; the run folder /runs is the PersistentVolumeClaim
``--runs-claim`` (ReadWriteMany: every pod writes checkpoints there) and data paths /data/<name>
are read-only from the same claim's ``data/`` folder; /dev/shm a memory emptyDir (NCCL and the
data loaders use shared memory). CPUs, memory and GPUs per node are the container's requests and
limits (``nvidia.com/gpu``: one per rank of a GPU job, engines/gpus.py); --gpu MODEL a nodeSelector on
``nvidia.com/gpu.product``.
"""
from __future__ import annotations

from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import DATA_MOUNT, IMAGE_USER, RUNS_MOUNT
from simcluster.launcher.engines.document import kubelet_literal
from simcluster.launcher.engines.gpus import gpus_per_node, model

PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery's node label of the GPU model
CONTAINER = "node"  # the container name (Kubeflow's torch runtime names its trainer container "node")


def env_list(env: dict[str, str]) -> list[dict]:
    """A container's env entries; each value spelled so that it arrives unchanged (the kubelet expands
    ``$(NAME)`` in a value too: document.kubelet_literal)."""
    return [{"name": k, "value": kubelet_literal(v)} for k, v in env.items()]


def resources(launch: Launch) -> dict:
    node, limits = launch.node, {}
    if node.cpus_per_node is not None:
        limits["cpu"] = f"{int(round(node.cpus_per_node * 1000))}m"
    if node.memory_per_node is not None:
        mem = str(node.memory_per_node).lower()
        limits["memory"] = mem[:-1] + {"k": "Ki", "m": "Mi", "g": "Gi", "b": ""}[mem[-1]] if mem[-1] in "kmgb" else mem
    if gpus_per_node(launch):
        limits["nvidia.com/gpu"] = str(gpus_per_node(launch))
    return {"limits": limits, "requests": dict(limits)} if limits else {}


def volume_mounts(launch: Launch) -> list[dict]:
    mounts = [{"name": "runs", "mountPath": RUNS_MOUNT}, {"name": "tmp", "mountPath": "/tmp"},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    for m in launch.mounts:
        if m.target.startswith(DATA_MOUNT + "/"):
            mounts.append({"name": "runs", "mountPath": m.target, "subPath": "data/" + m.target.rsplit("/", 1)[1],
                           "readOnly": True})
    return mounts


def volumes(launch: Launch) -> list[dict]:
    return [{"name": "runs", "persistentVolumeClaim": {"claimName": launch.engine.runs_claim}},
            {"name": "tmp", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def security_context() -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def pod_security_context() -> dict:
    uid, gid = (int(x) for x in IMAGE_USER.split(":"))
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid, "fsGroup": gid}


def container(launch: Launch, command: list[str], env: dict[str, str], env_from_fields: dict[str, str] | None = None) -> dict:
    """The node container: command, env (plain values, then downward-API fields), resources, mounts."""
    env_entries = env_list(env) + [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}}
                                   for k, v in (env_from_fields or {}).items()]
    c = {"name": CONTAINER, "image": launch.node.image, "command": command, "env": env_entries}
    if resources(launch):
        c["resources"] = resources(launch)
    c["volumeMounts"] = volume_mounts(launch)
    c["securityContext"] = security_context()
    return c


def node_selector(launch: Launch) -> dict:
    """The nodes a pod may run on: those GPU feature discovery labels with the --gpu model, when given."""
    names = model(launch)
    return {"nodeSelector": {PRODUCT_LABEL: names.product}} if names else {}


def pod_spec(launch: Launch, command: list[str], env: dict[str, str], env_from_fields: dict[str, str] | None = None,
             subdomain: str | None = None) -> dict:
    """A whole pod spec (the JobSet's): restartPolicy Never, the container, volumes."""
    spec = {"restartPolicy": "Never"}
    if subdomain:
        spec["subdomain"] = subdomain
    spec.update(node_selector(launch))
    spec.update(securityContext=pod_security_context(), containers=[container(launch, command, env, env_from_fields)],
                volumes=volumes(launch))
    return spec
