"""JobSet engine: a Launch -> a ``jobset.x-k8s.io/v1alpha2`` JobSet (one Job per node).

    python -m launcher generate --mesh 2x2x2 --model tiny --target jobset   # k8s/mesh-2x2x2-jobset.yaml
    kubectl apply -f k8s/mesh-2x2x2-jobset.yaml       # on a cluster with the JobSet controller

One replicated job ``node`` with ``replicas: NNODES``, each Job one pod (parallelism 1,
backoffLimit 0). The JobSet's job index (annotation ``jobset.sigs.k8s.io/job-index``, given to
the container as NODE_RANK by the downward API) is torchrun's ``--node-rank $(NODE_RANK)``
(kubelet expands it; no shell), so node k holds ranks k*nproc .. (k+1)*nproc-1 and pipeline
stage k; ``--master-addr`` is job 0's pod, reachable by its DNS host name
``NAME-node-0-0.NAME`` (network.enableDNSHostnames, subdomain NAME). failurePolicy maxRestarts 0:
a failed node fails the set (a torchrun job cannot lose a rank); raise it together with
``--resume auto --ckpt-every N`` to restart from the newest checkpoint.
"""
from __future__ import annotations

from simcluster.launcher.engines.document import k8s_name, kubelet_literal, torchrun_argv, with_dump_folder
from simcluster.launcher.engines.kubernetes import Kubernetes, pod_env
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.engines.pod import pod_spec

JOB = "node"  # the replicated job's name: pods are NAME-node-K-0
JOB_INDEX = "metadata.annotations['jobset.sigs.k8s.io/job-index']"


def master_addr(name: str) -> str:
    """The DNS name of job 0's pod: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>."""
    return f"{name}-{JOB}-0-0.{name}"


def command(launch: Launch) -> list[str]:
    """torchrun with the job index as --node-rank, once the run's Flight Recorder folder exists; the job's own
    arguments reach it as typed (kubelet_literal)."""
    return with_dump_folder(torchrun_argv(launch, "$(NODE_RANK)", master_addr(k8s_name(launch)),
                                          tuple(map(kubelet_literal, launch.argv))), launch.output_dir)


def build(launch: Launch) -> dict:
    name = k8s_name(launch)
    env = pod_env(launch, MASTER_ADDR=master_addr(name))
    labels = {"app.kubernetes.io/name": "simcluster", "app.kubernetes.io/instance": name}
    pod = pod_spec(launch, command(launch), env, {"NODE_RANK": JOB_INDEX, "SIMCLUSTER_NODE": JOB_INDEX}, subdomain=name)
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [{
                "name": JOB,
                "replicas": launch.nnodes,
                "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                                      "template": {"metadata": {"labels": labels}, "spec": pod}}},
            }],
        },
    }


class JobSet(Kubernetes):
    """The JobSet engine: rendered here (``generate --target jobset``), run with kubectl on a cluster."""

    name = "jobset"
    default_path = "k8s/{job}-jobset.yaml"
    module = "jobset"
    build = staticmethod(build)
