"""The swarm engine: render.py (its document), run.py (up here), engine.py (the class).

    python -m launcher generate --mesh 2x2x2 --target swarm --stdout
"""
