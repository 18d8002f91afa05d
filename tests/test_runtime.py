"""Unit tests of train/runtime.py: the glibc allocator settings, the step-driven garbage collector
and the frozen imports.

    python -m pytest -q tests/test_runtime.py
"""
from __future__ import annotations

import gc
import json
import platform
import subprocess
import sys

from simcluster.train.runtime import GarbageCollection

GLIBC = platform.libc_ver()[0] == "glibc"


def _tune_malloc_in_child(env: dict[str, str]) -> str:
    """tune_malloc() in a fresh interpreter (mallopt changes the whole process)."""
    code = "from train.runtime import tune_malloc; print(tune_malloc())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_tune_malloc_applies_on_glibc_unless_the_user_set_malloc_env():
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parent.parent)}
    assert _tune_malloc_in_child(base) == str(GLIBC)  # mallopt(3) is glibc's; elsewhere a no-op
    assert _tune_malloc_in_child({**base, "MALLOC_TRIM_THRESHOLD_": "131072"}) == "False"


def test_garbage_collection_every_n_steps_and_restored():
    collected = []

    def on_gc(phase, info):
        if phase == "stop":
            collected.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(on_gc)
    try:
        with GarbageCollection(every=3) as collector:
            assert not gc.isenabled() and collected == [1]  # the young generations only, never a full pass
            collected.clear()
            for step in range(1, 8):
                collector.step(step)
            assert collected == [1, 1]  # steps 3 and 6, generation 1
        assert gc.isenabled()
        with GarbageCollection(every=0) as collector:
            assert gc.isenabled()
    finally:
        gc.callbacks.remove(on_gc)


def test_frozen_imports_are_out_of_a_full_collection_and_later_objects_are_not():
    """freeze_imports in a fresh interpreter: the objects alive then are permanent (none of them in
    the generations a full collection walks), a cycle made after is still collected: what the
    rank's teardown (``del trainer; gc.collect()``) relies on."""
    code = """
import gc, json
import simcluster.train.trainer
from simcluster.train.runtime import freeze_imports
before = len(gc.get_objects())
freeze_imports()
after = len(gc.get_objects())
class Node: pass
a, b = Node(), Node(); a.b, b.a = b, a; del a, b
print(json.dumps({"before": before, "after": after, "frozen": gc.get_freeze_count(), "freed": gc.collect()}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert out["before"] > 100_000 and out["frozen"] >= out["before"] and out["after"] < 100, out
    assert out["freed"] >= 2, out  # the cycle made after the freeze (two objects and their dicts)
