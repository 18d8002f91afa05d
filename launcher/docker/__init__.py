"""The Docker floor: the one door to the Docker SDK and the Docker CLIs; below the daemons, drills and observe.

    python -c "from simcluster.launcher.docker.client import Client; print(Client().info()['ServerVersion'])"
"""
