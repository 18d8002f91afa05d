"""simcluster launcher: one Docker container per pipeline stage (node), torchrun inside each.

    python -m launcher generate --mesh 2x2x2          # writes compose/mesh-2x2x2.yml
    python -m launcher up --mesh 2x2x2 --steps 50     # build if needed, run, summarise, down
    python -m launcher status | logs | down

Torch-free except launcher/rendezvous.py, launcher/node.py, launcher/forkrun.py and launcher/probe.py, which run
inside the trainer image.
"""
