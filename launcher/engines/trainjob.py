"""TrainJob engine: a Launch -> a Kubeflow Trainer ``trainer.kubeflow.org/v1alpha1`` TrainJob.

    python -m launcher generate --mesh 2x2x2 --model tiny --target trainjob   # k8s/mesh-2x2x2-trainjob.yaml
    kubectl apply -f k8s/mesh-2x2x2-trainjob.yaml    # with Kubeflow Trainer and its torch-distributed runtime

``runtimeRef: torch-distributed`` (the ClusterTrainingRuntime Kubeflow ships), ``numNodes``
NNODES, ``numProcPerNode`` dp*tp, ``resourcesPerNode`` the CPUs, memory and GPUs per node.
The runtime injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and
PET_MASTER_PORT into the ``node`` container; the command passes them to torchrun explicitly
(``--node-rank $(PET_NODE_RANK)``, expanded by the kubelet; static rendezvous), so node k holds
ranks k*nproc .. (k+1)*nproc-1 and pipeline stage k. Volumes, mounts and the security context
go through ``runtimePatches`` (the TrainJob has no pod template of its own), with the --gpu model's
nodeSelector. The document is written for Kubeflow Trainer v2.3 (TRAINER_RELEASE, named in its
header and a label): v2.3 merges ``runtimePatches`` as strategic merge patches, v2.2 (where the
field replaced ``podTemplateOverrides``) by its own rules, and the two releases' APIs are not
compatible (Kueue's TrainJob integration asks for v2.3 or later). tests/test_targets.py validates
the document against v2.3's published API (kubeflow-trainer-api 2.3.0, generated from its OpenAPI).
"""
from __future__ import annotations

from simcluster.launcher.engines.document import entry, k8s_name, kubelet_literal, with_dump_folder
from simcluster.launcher.engines.kubernetes import Kubernetes, pod_env
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.engines.pod import (CONTAINER, env_list, node_selector, pod_security_context, resources,
                                             security_context, volume_mounts, volumes)

RUNTIME = "torch-distributed"
TRAINER_RELEASE = "v2.3"  # the Kubeflow Trainer release whose TrainJob API this document is written for
PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def command(launch: Launch) -> list[str]:
    """torchrun with every placement value from the runtime's PET_* variables, once the run's Flight
    Recorder folder exists; the job's own arguments reach it as typed (kubelet_literal)."""
    return with_dump_folder(["torchrun", "--nnodes", "$(PET_NNODES)", "--nproc-per-node", "$(PET_NPROC_PER_NODE)",
                             "--node-rank", "$(PET_NODE_RANK)", "--master-addr", "$(PET_MASTER_ADDR)",
                             "--master-port", "$(PET_MASTER_PORT)", "--rdzv-backend", "static",
                             *entry(launch, tuple(map(kubelet_literal, launch.argv)))], launch.output_dir)


def master_addr(name: str) -> str:
    """PET_MASTER_ADDR as the torch runtime sets it: node 0's pod, <trainjob>-node-0-0.<trainjob>."""
    return f"{name}-node-0-0.{name}"


def build(launch: Launch) -> dict:
    name = k8s_name(launch)
    env = pod_env(launch)
    trainer = {"image": launch.node.image, "command": command(launch),
               "env": env_list(env),
               "numNodes": launch.nnodes, "numProcPerNode": launch.nproc_per_node}
    if resources(launch):
        trainer["resourcesPerNode"] = resources(launch)
    pod_patch = {**node_selector(launch), "securityContext": pod_security_context(), "volumes": volumes(launch),
                 "containers": [{"name": CONTAINER, "volumeMounts": volume_mounts(launch),
                                 "securityContext": security_context()}]}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "simcluster",
                                              "simcluster.io/kubeflow-trainer": TRAINER_RELEASE}},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": RUNTIME},
            "trainer": trainer,
            "runtimePatches": [{"manager": "simcluster", "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod_patch}}}}]}}}}],
        },
    }


class TrainJob(Kubernetes):
    """The TrainJob engine: rendered here (``generate --target trainjob``), run with kubectl on a cluster."""

    name = "trainjob"
    default_path = "k8s/{job}-trainjob.yaml"
    module = "trainjob"
    build = staticmethod(build)
    requires = (f"# For Kubeflow Trainer {TRAINER_RELEASE} or later and its {RUNTIME} ClusterTrainingRuntime (v2.2 "
                f"merges runtimePatches by other rules: its API is not v2.3's).\n")
