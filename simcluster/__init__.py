"""simcluster: run and test 3D-parallel PyTorch training (pp x dp x tp) on a simulated multi-node cluster.

    python -m simcluster generate --mesh 2x2x2        # = the `simcluster` command = python -m launcher (checkout)
    python -c "import simcluster.core.layout as l; print(l.node_names(2))"

The one import name of this project, so that a user's own ``train.py``, ``launcher.py`` or
``train/`` package never shadows it: every import of this project's code goes through
``simcluster.launcher`` (the torch-free host side) and ``simcluster.train`` (the trainer and the
facts both sides share). Each such name is a path: in a checkout ``simcluster/launcher`` and
``simcluster/train`` are links to the top-level folders ``launcher/`` and ``train/``; installed with
pip they are the folders themselves (pyproject.toml). docs/layout.md draws the floors.

API for your code on the cluster: ``simcluster.log(step=..., loss=...)`` and ``simcluster.step()``.
API for your tests (imported on first use: the ranks never load it): ``simcluster.run(...) -> Run``
(launcher/api.py), ``simcluster.compare(...)`` (launcher/compare.py), ``simcluster.sweep(...)`` (launcher/sweep.py), the faults ``Kill``, ``Stop``,
``Pause``, ``Disconnect``, ``Freeze``, ``KillHost``, ``DisconnectHost`` (launcher/drills/faults.py) for
``run(chaos=...)``, and the
errors ``ConfigError`` (bad input: the CLI's exit 2; simcluster/core/errors.py) and ``LauncherError`` (Docker
failed; launcher/docker/client.py). The pytest plugin (``pip install "simcluster[pytest]"``):
launcher/testing/plugin.py.
"""

FAULTS = ("Kill", "Stop", "Pause", "Disconnect", "Freeze", "KillHost", "DisconnectHost")


def __getattr__(name):
    """The test API's names, imported on first use (PEP 562), so ``import simcluster`` stays light."""
    if name in ("run", "Run", "FailedRank"):
        from simcluster.launcher import api as home
    elif name == "compare":
        from simcluster.launcher import compare as home
    elif name == "sweep":
        from simcluster.launcher import sweep as home
    elif name in FAULTS:
        from simcluster.launcher.drills import faults as home
    elif name == "ConfigError":
        from simcluster.core import errors as home
    elif name == "LauncherError":
        from simcluster.launcher.docker import client as home
    else:
        raise AttributeError(f"module 'simcluster' has no attribute {name!r}")
    return getattr(home, name)


def log(step=None, *, total_steps=None, **metrics):
    """Log what only your code knows (``loss=...``) for step ``step`` into the run's metrics.jsonl;
    a no-op outside the cluster. See launcher/instrument/log.py."""
    from simcluster.launcher.instrument.log import log as _log
    _log(step, total_steps=total_steps, **metrics)


def step():
    """Mark the end of a training step, for code whose steps are not optimizer steps (a no-op
    outside the cluster). See launcher/instrument/log.py."""
    from simcluster.launcher.instrument.log import step as _step
    _step()
