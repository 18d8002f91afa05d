"""The table at the door: every engine by the name ``--target`` takes, one class each (base.py's contract).

    python -c "from simcluster.launcher.engines.registry import ENGINES; print(list(ENGINES))"

cli.py (generate, up, status, logs, down), api.py, parser.py (the --target choices),
drills/shaping.py and compare.py read it (job/ never: the request keeps --target as text); none of them branches on an engine's name: what differs
is an attribute or a method of the engine (compose/engine.py, swarm/engine.py, slurm/engine.py,
jobset.py, trainjob.py, skypilot.py).
"""
from __future__ import annotations

from simcluster.launcher.engines.base import Engine
from simcluster.launcher.engines.compose.engine import Compose
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.engines.jobset import JobSet
from simcluster.launcher.engines.skypilot import SkyPilot
from simcluster.launcher.engines.slurm.engine import Slurm
from simcluster.launcher.engines.swarm.engine import Swarm
from simcluster.launcher.engines.trainjob import TrainJob
from simcluster.launcher.job.sections import EngineOptions

ENGINES: dict[str, Engine] = {e.name: e for e in (Compose(), Swarm(), Slurm(), JobSet(), TrainJob(), SkyPilot())}
DEFAULT = EngineOptions.target  # --target's default (job/sections.py): the simulation, where compare and chaos run


def engine_named(name: str) -> Engine:
    """The engine --target names: the request keeps it as text, the door looks it up here.

    Raises:
        ConfigError: no engine of that name, naming them all and an example.
    """
    if name not in ENGINES:
        from simcluster.core.errors import ConfigError

        e = ConfigError(f"target: must be one of {', '.join(ENGINES)}, got {name!r}; e.g. target={DEFAULT!r} "
                        f"(--target {DEFAULT})")
        e.field = "target"
        raise e
    return ENGINES[name]


def engine_of(handle: Handle) -> Engine:
    """The engine whose run handle is (status, logs, down).

    Raises:
        ConfigError: none owns it (never for a handle Handle.find returned).
    """
    for engine in ENGINES.values():
        if engine.owns(handle):
            return engine
    from simcluster.core.errors import ConfigError

    raise ConfigError(f"{handle.file}: no engine runs this handle here")


def runs_here() -> list[str]:
    """The engines `launcher up` runs on this machine."""
    return [name for name, engine in ENGINES.items() if engine.runs_here]
