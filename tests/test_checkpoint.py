"""Checkpoints: atomic layout, exact resume on the same mesh, resume on other meshes (pp changes too).

    python -m pytest -q tests/test_checkpoint.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import warm
from simcluster.train.checkpoint_paths import list_checkpoints, resolve_resume
from simcluster.core.config import Config, parse_mesh
from simcluster.train.data import dp_shard, lm_batch
from simcluster.core.metrics import MetricsWriter, read_metrics
from simcluster.train.preflight import check

STEPS, SAVE_AT = 6, 3
COMMON = ["--model", "tiny", f"--steps={STEPS}", "--val-every=0"]


def torchrun(mesh: str, run_dir: Path, *extra: str) -> list[dict]:
    """Run ``python -m train`` on local processes; returns the run's metrics records. The ranks start
    under forkrun (torchrun's agent, ranks forked after one import, as on the cluster's nodes: about
    a third of stock torchrun's CPU on 2 cores; tests/test_launcher_runtime.py checks the two alike),
    itself forked from the worker's warm interpreter (tests/warm.py)."""
    world = parse_mesh(mesh).world_size
    args = ["--standalone", f"--nproc-per-node={world}", "-m", "simcluster.train", f"--mesh={mesh}", *COMMON,
            f"--run-dir={run_dir}", *extra]
    proc = warm.run("simcluster.train.forkrun", args, cwd=os.getcwd(), timeout=600,
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return read_metrics(str(run_dir))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An uninterrupted 2x2x2 run that checkpoints at step SAVE_AT and at the end."""
    run = tmp_path_factory.mktemp("base")
    recs = torchrun("2x2x2", run, f"--ckpt-every={SAVE_AT}")
    return run, {r["step"]: r for r in recs}


def test_checkpoint_layout(saved):
    run, recs = saved
    assert sorted(recs) == list(range(1, STEPS + 1))
    found = list_checkpoints(str(run / "checkpoints"))
    assert [s for s, _ in found] == [SAVE_AT, STEPS]
    assert not [p for p in os.listdir(run / "checkpoints") if p.startswith(".tmp")]
    assert resolve_resume(str(run)) == found[-1][1]


@pytest.mark.parametrize("mesh,tol", [("2x2x2", 1e-6), ("1x2x2", 1e-4), ("2x1x2", 1e-4), ("1x4x1", 1e-4),
                                      ("1x1x1", 1e-4), ("4x1x2", 1e-4)])
def test_resume_matches_uninterrupted_run(saved, tmp_path, mesh, tol):
    run, base = saved
    recs = torchrun(mesh, tmp_path, f"--resume={run / 'checkpoints' / f'step-{SAVE_AT:06d}'}")
    assert [r["step"] for r in recs] == list(range(SAVE_AT + 1, STEPS + 1))  # none repeated, none skipped
    for r in recs:
        ref = base[r["step"]]
        assert abs(r["loss"] - ref["loss"]) <= tol * ref["loss"], (mesh, r["step"], r["loss"], ref["loss"])
        assert abs(r["grad_norm"] - ref["grad_norm"]) <= max(tol, 1e-5) * ref["grad_norm"]
        assert r["lr"] == pytest.approx(ref["lr"], rel=1e-12)


def test_incomplete_saves_are_ignored(tmp_path):
    """A save killed midway leaves a .tmp- folder or a folder without DCP metadata: never picked."""
    ck = tmp_path / "checkpoints"
    (ck / "step-000004").mkdir(parents=True)
    (ck / "step-000004" / ".metadata").write_bytes(b"x")
    (ck / ".tmp-step-000008").mkdir()
    (ck / ".tmp-step-000008" / ".metadata").write_bytes(b"x")
    (ck / "step-000006").mkdir()  # no .metadata: rename never happened for a complete save
    assert [s for s, _ in list_checkpoints(str(ck))] == [4]
    assert resolve_resume(str(tmp_path)).endswith("step-000004")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_resume(str(tmp_path / "nothing"))


def test_bad_resume_path_fails_preflight(tmp_path):
    errors = check(Config(model="tiny", resume=str(tmp_path)))
    assert any("no complete checkpoint" in e for e in errors)


def test_metrics_keep_each_step_once_on_resume(tmp_path):
    w = MetricsWriter(str(tmp_path))
    for s in range(1, 8):
        w.write({"step": s, "loss": float(s)})
    MetricsWriter(str(tmp_path), keep_until=5).write({"step": 6, "loss": 60.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(str(tmp_path))] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0),
                                                                            (5, 5.0), (6, 60.0)]


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_data_position_is_global_samples(dp):
    """The samples of a step are the same whatever dp, so a resume on another dp repeats and skips nothing."""
    tokens = torch.arange(5000) % 256
    x, _ = lm_batch(tokens.to(torch.uint8), seed=1, step=7, batch=8, seq_len=16)
    assert torch.equal(torch.cat([dp_shard(x, r, dp) for r in range(dp)]), x)
