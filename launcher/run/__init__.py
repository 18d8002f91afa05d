"""Runners: one class per engine that ``launcher up`` runs here, behind one contract (base.py).

    python -m launcher up --mesh 2x2x2 --model tiny --steps 3                    # compose (default)
    python -m launcher up --target swarm --mesh 2x2x2 --model tiny --steps 3     # a one-node Docker Swarm
    python -m launcher up --target slurm --mesh 2x2x2 --model tiny --steps 3     # Slurm in containers

The table at the door, RUNNERS: compose.py (the simulation: restarts, late starts, shaping),
swarm.py (the stack on a swarm), slurm.py (slurmctld + slurmd containers, sbatch). Each renders its
document with launcher/targets/ and follows it with the shared skeleton of base.py.
"""
from __future__ import annotations

import importlib

RUNNERS = {"compose": "ComposeRunner", "swarm": "SwarmRunner", "slurm": "SlurmRunner"}  # target -> its class


def runner(target: str):
    """The Runner of a target (imports its module: the Docker SDK only once something runs).

    Raises:
        KeyError: not in RUNNERS.
    """
    return getattr(importlib.import_module(f"{__name__}.{target}"), RUNNERS[target])()
