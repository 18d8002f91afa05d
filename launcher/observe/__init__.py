"""What a run shows and leaves: its logs followed, progress, the summary, the report.

    python -m launcher report --run-dir runs/mesh-2x2x2
"""
