"""`launcher sweep` on real containers: a pipeline whose stage index is LOCAL_RANK differs at step 1
between its own layout (2 nodes x 1 rank) and one node holding both ranks; the built-in trainer
agrees on both layouts of its mesh.

    python -m pytest -q tests/test_sweep.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_sweep.py    # fails instead

Four clusters of 2 ranks (the smallest world with two layouts), 2-3 steps each, --quiet. Needs
the image simcluster/trainer (bash images/build.sh); --mount-code runs this checkout's code.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import noise

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]


def sweep(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep", "--mount-code", "--quiet", "--run-dir",
                           str(tmp_path / "runs"), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return proc, time.monotonic() - t0


def losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_local_rank_as_the_stage_index_differs_at_step_1_between_layouts(tmp_path):
    proc, took = sweep(tmp_path, "--script", "examples/bugs/layout_bugs.py", "--nodes", "2", "--nproc-per-node", "1",
                       "--", "--bug", "local-rank-stage", "--steps", "3")
    out = proc.stdout
    assert proc.returncode == 1, out[-5000:] + proc.stderr[-2000:]
    own, one = losses(tmp_path / "runs" / "nodes-2x1"), losses(tmp_path / "runs" / "nodes-1x2")
    assert len(own) == len(one) == 3 and all(abs(a - b) > 1e-3 * abs(b) for a, b in zip(one, own)), (own, one)
    assert (f"sweep: DIFFERS: loss first differs at step 1: one node (1 node x 2 ranks) {one[0]:.8g} against "
            f"{own[0]:.8g} on own (2 nodes x 1 rank) (rel diff ") in out, out[-3000:]
    assert "sweep: run own (2 nodes x 1 rank) ok, 3 step(s) of loss" in out and "node-0 r0" not in out
    assert not noise(out), noise(out)
    print(f"sweep of the LOCAL_RANK bug: {took:.1f}s\n{out[out.index('sweep loss'):]}")


def test_the_built_in_trainer_agrees_on_every_layout_of_its_mesh(tmp_path):
    proc, took = sweep(tmp_path, "--mesh", "2x1x1", "--model", "tiny", "--steps", "2")
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
    own, one = losses(tmp_path / "runs" / "nodes-2x1"), losses(tmp_path / "runs" / "nodes-1x2")
    assert len(own) == len(one) == 2 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(one, own)), (own, one)
    assert out.rstrip().endswith("sweep: OK: loss agrees within rtol 1e-05 at all 2 steps on every layout: own (mesh "
                                 "2x1x1 on 2 nodes x 1 rank), one node (mesh 2x1x1 on 1 node x 2 ranks)"), out[-3000:]
    log = (tmp_path / "runs" / "nodes-1x2" / "cluster.log").read_text()
    assert "node-0 r1" in log and "node-1" not in log.split("== summary")[0].replace("rendezvous", ""), log[-3000:]
    assert not noise(out), noise(out)
    print(f"sweep of the built-in trainer: {took:.1f}s\n{out[out.index('sweep loss'):]}")
