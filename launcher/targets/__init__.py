"""Engine targets: one pure function per engine, a Launch in, the engine's own document out.

    python -m launcher generate --mesh 2x2x2 --target slurm      # writes slurm/mesh-2x2x2.sbatch
    python -m launcher generate --mesh 2x2x2 --target jobset     # writes k8s/mesh-2x2x2-jobset.yaml
    python -m launcher generate --mesh 2x2x2 --target swarm      # writes swarm/mesh-2x2x2.yml

compose (launcher/compose.py, the simulation), swarm.py (a Docker Swarm stack: the Compose
services, c10d rendezvous), slurm.py (a batch script), jobset.py (a JobSet), trainjob.py (a
Kubeflow Trainer TrainJob). slurm, jobset and trainjob start stock torchrun with the static
rendezvous and the node rank taken from the engine's own node index (common.py).
Deterministic: the same Launch gives the same bytes.
"""
from __future__ import annotations

TARGETS = ("compose", "swarm", "slurm", "jobset", "trainjob")
UP_TARGETS = ("compose", "swarm", "slurm")  # what `launcher up` runs here


def default_path(target: str, job_name: str) -> str:
    """Where ``generate --target T`` writes without --out, relative to the repo root."""
    return {"compose": f"compose/{job_name}.yml", "swarm": f"swarm/{job_name}.yml",
            "slurm": f"slurm/{job_name}.sbatch", "jobset": f"k8s/{job_name}-jobset.yaml", "trainjob": f"k8s/{job_name}-trainjob.yaml"}[target]
