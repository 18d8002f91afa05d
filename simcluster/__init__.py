"""simcluster: run and test 3D-parallel PyTorch training (pp x dp x tp) on a simulated multi-node cluster.

    python -m simcluster generate --mesh 2x2x2        # = the `simcluster` command = python -m launcher (checkout)
    python -c "import simcluster.launcher.layout as l; print(l.node_names(2))"

The one import name of this project, so that a user's own ``train.py``, ``launcher.py`` or
``train/`` package never shadows it: every internal import goes through ``simcluster.launcher``
(the torch-free host side) and ``simcluster.train`` (the trainer). Installed with pip, those are
real sub-packages (pyproject.toml maps the top-level folders launcher/, train/ and images/ into
this package). In a checkout the folders are this folder's siblings, so the package's search
path takes in the checkout's root: ``simcluster.launcher`` is ``<checkout>/launcher``.

API for your code on the cluster: ``simcluster.log(step=..., loss=...)`` and ``simcluster.step()``.
API for your tests (launcher/api.py, imported on first use: the ranks never load it):
``simcluster.run(script="train.py", mesh="2x2x2", args=[...], **up_options) -> Run``,
``simcluster.compare(...)`` (launcher/compare.py), the faults ``Kill``, ``Stop``, ``Pause``,
``Disconnect``, ``Freeze`` (launcher/drills/faults.py) for ``run(chaos=...)``, and the errors
``ConfigError`` (bad input: the CLI's exit-2 message) and ``LauncherError`` (Docker failed).
The pytest plugin (``pip install "simcluster[pytest]"``): launcher/testing/plugin.py.
"""
import os as _os

_HERE = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_HERE, "launcher")):  # a checkout: launcher/ and train/ beside this folder
    __path__.append(_os.path.dirname(_HERE))


_LAZY = {"run": "simcluster.launcher.api", "Run": "simcluster.launcher.api", "FailedRank": "simcluster.launcher.api",
         "compare": "simcluster.launcher.compare", "Kill": "simcluster.launcher.drills.faults",
         "Stop": "simcluster.launcher.drills.faults", "Pause": "simcluster.launcher.drills.faults",
         "Disconnect": "simcluster.launcher.drills.faults", "Freeze": "simcluster.launcher.drills.faults",
         "ConfigError": "simcluster.train.config", "LauncherError": "simcluster.launcher.engine"}


def __getattr__(name):
    """The test API's names, imported on first use (PEP 562), so ``import simcluster`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'simcluster' has no attribute {name!r}")


def log(step=None, *, total_steps=None, **metrics):
    """Log what only your code knows (``loss=...``) for step ``step`` into the run's metrics.jsonl;
    a no-op outside the cluster. See simcluster/launcher/instrument/log.py."""
    from simcluster.launcher.instrument.log import log as _log
    _log(step, total_steps=total_steps, **metrics)


def step():
    """Mark the end of a training step, for code whose steps are not optimizer steps (a no-op
    outside the cluster). See simcluster/launcher/instrument/clock.py."""
    from simcluster.launcher.instrument.log import step as _step
    _step()
