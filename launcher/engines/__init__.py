"""The engines a job runs on or is rendered for, and the one door to Docker (docker.py).

    python -c "import simcluster.launcher.engines.docker, simcluster.launcher.engines.handle"
"""
