"""The engines: one class each behind base.py's contract, and the table ENGINES (registry.py). Docker itself is
the floor below (launcher/docker/: the SDK's Client, the Compose and stack CLIs).

    python -c "from simcluster.launcher.engines.registry import ENGINES; print(list(ENGINES))"
"""
