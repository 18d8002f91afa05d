"""simcluster: run and test 3D-parallel PyTorch training (pp x dp x tp) on a simulated multi-node cluster.

    python -m simcluster generate --mesh 2x2x2        # = the `simcluster` command = python -m launcher (checkout)
    python -c "import simcluster.launcher.layout as l; print(l.node_names(2))"

The one import name of this project, so that a user's own ``train.py``, ``launcher.py`` or
``train/`` package never shadows it: every internal import goes through ``simcluster.launcher``
(the torch-free host side) and ``simcluster.train`` (the trainer). Installed with pip, those are
real sub-packages (pyproject.toml maps the top-level folders launcher/, train/ and images/ into
this package). In a checkout the folders are this folder's siblings, so the package's search
path takes in the checkout's root: ``simcluster.launcher`` is ``<checkout>/launcher``.
"""
import os as _os

_HERE = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_HERE, "launcher")):  # a checkout: launcher/ and train/ beside this folder
    __path__.append(_os.path.dirname(_HERE))
