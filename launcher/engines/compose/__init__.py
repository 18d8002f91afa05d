"""The Compose engine: render.py (the compose file), run.py (up), status.py (status, logs, down), engine.py.

    python -m launcher generate --mesh 2x2x2 --target compose --stdout
"""
