"""Finding checkpoints on disk. Torch-free, so preflight can check ``--resume`` before anything starts.

    python -c "from simcluster.train.checkpoint_paths import list_checkpoints; print(list_checkpoints('runs/a/checkpoints'))"
"""
from __future__ import annotations

import os
import re

STEP_DIR = re.compile(r"^step-(\d{6,})$")


def list_checkpoints(folder: str) -> list[tuple[int, str]]:
    """Complete checkpoints in a folder as (step, path), oldest first; ``.tmp-`` saves are skipped."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        m = STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(folder, name, ".metadata")):
            found.append((int(m[1]), os.path.join(folder, name)))
    return sorted(found)


def resolve_resume(path: str) -> str:
    """A checkpoint folder, or the latest complete one inside a ``checkpoints`` folder.

    Raises:
        FileNotFoundError: nothing loadable there (message says what was looked for).
    """
    if os.path.exists(os.path.join(path, ".metadata")):
        return path
    found = list_checkpoints(path) or list_checkpoints(os.path.join(path, "checkpoints"))
    if not found:
        raise FileNotFoundError(f"resume: no complete checkpoint (step-NNNNNN/.metadata) under {path!r}")
    return found[-1][1]
