"""Engine targets: one pure renderer per engine, a Launch in, the engine's own document out.

    python -m launcher generate --mesh 2x2x2                     # compose/mesh-2x2x2.yml (the simulation)
    python -m launcher generate --mesh 2x2x2 --target slurm      # writes slurm/mesh-2x2x2.sbatch
    python -m launcher generate --mesh 2x2x2 --target jobset     # writes k8s/mesh-2x2x2-jobset.yaml
    python -m launcher generate --mesh 2x2x2 --target swarm      # writes swarm/mesh-2x2x2.yml

The table at the door, TARGETS: compose.py (the simulation), swarm.py (a Docker Swarm stack: the
Compose services, c10d rendezvous), slurm.py (a batch script), jobset.py (a JobSet), trainjob.py
(a Kubeflow Trainer TrainJob). slurm, jobset and trainjob start stock torchrun with the static
rendezvous and the node rank taken from the engine's own node index (document.py, which also
holds the one YAML dumper and header every renderer uses). Each module's
``render(launch, command, file, project_dir) -> str`` is deterministic: the same Launch gives the
same bytes. Which of them `launcher up` can also run here is launcher/run/'s table.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One engine's document: its renderer module (launcher/targets/<name>.py) and where
    ``generate`` writes it without --out ({job}: the job's name, e.g. mesh-2x2x2)."""

    name: str
    default_path: str

    def render(self, launch, command: str, file: str, project_dir: str) -> str:
        """The document's text. file: its path as typed from the repo root (named in its header);
        project_dir: from the file's folder to the repo root (relative bind sources start there)."""
        return importlib.import_module(f"{__name__}.{self.name}").render(launch, command, file, project_dir)


TARGETS = {t.name: t for t in (
    Target("compose", "compose/{job}.yml"),
    Target("swarm", "swarm/{job}.yml"),
    Target("slurm", "slurm/{job}.sbatch"),
    Target("jobset", "k8s/{job}-jobset.yaml"),
    Target("trainjob", "k8s/{job}-trainjob.yaml"),
)}


def default_path(target: str, job_name: str) -> str:
    """Where ``generate --target T`` writes without --out, relative to the repo root."""
    return TARGETS[target].default_path.format(job=job_name)
