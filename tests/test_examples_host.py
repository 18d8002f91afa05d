"""examples/pipelining.py's pure part on the host, no Docker: the stage split.

    python -m pytest -q tests/test_examples_host.py

The example itself runs on containers (tests/test_user_code.py: 2x2x2, 1F1B over 4 microbatches,
an order GPipe does not take, against one process).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "pipelining.py"


def test_stage_range_splits_every_block_once():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from pipelining import stage_range
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert [list(stage_range(4, 2, s)) for s in range(2)] == [[0, 1], [2, 3]]
    assert [list(stage_range(7, 3, s)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert list(stage_range(4, 1, 0)) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        stage_range(2, 3, 0)
