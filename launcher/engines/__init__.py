"""The engines: one class each behind base.py's contract, the table ENGINES (registry.py), and the one door to
Docker (docker.py, docker_images.py, docker_cluster.py: the SDK; compose_cli.py: the Compose and stack CLIs).

    python -c "from simcluster.launcher.engines.registry import ENGINES; print(list(ENGINES))"
"""
