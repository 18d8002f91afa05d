"""simcluster launcher: one Docker container per node (pipeline stage group), torchrun inside each.

    python -m launcher generate --mesh 2x2x2          # writes compose/mesh-2x2x2.yml
    python -m launcher up --mesh 2x2x2 --steps 50     # build if needed, run, summarise, down
    python -m launcher status | logs | down | chaos

Host side (torch-free): cli.py (flags, the door) -> launch.py (the frozen Launch, resolved once)
-> compose.py (pure: Launch -> compose document) -> runner.py / follow.py / chaos.py (run it,
through engine.py: the Docker SDK and the Compose CLI). layout.py holds the facts both sides
share. Inside the containers: launcher/container/ (rendezvous, node wrapper, forkrun, probe).
"""
