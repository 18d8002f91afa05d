"""Resume that checks what it loads: the checkpoint record, refusals, applied hyperparameters,
``--resume auto``, damaged checkpoints; and a run whose loss or grad norm turns non-finite.

    python -m pytest -q tests/test_resume.py
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import warm
from simcluster.core.config import Config
from simcluster.core.metrics import read_metrics
from simcluster.train.optim import lr_at

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
COMMON = ["--model", "tiny", "--val-every", "0"]


def train(*args: str) -> subprocess.CompletedProcess:
    """``python -m train`` in one process (mesh 1x1x1), forked from the worker's warm interpreter
    (tests/warm.py: torch and the trainer imported once, not once a run)."""
    return warm.run("train", [*COMMON, *args], cwd=ROOT, env=ENV, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """An uninterrupted 6-step run checkpointing at steps 2, 4 and 6 (all kept)."""
    run = tmp_path_factory.mktemp("base")
    ok(train("--steps", "6", "--ckpt-every", "2", "--ckpt-keep", "0", "--run-dir", str(run)))
    return run


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:06d}"


def test_checkpoint_records_what_it_was_made_with(base):
    rec = json.loads((ckpt(base, 4) / "simcluster.json").read_text())
    assert rec["step"] == 4 and rec["samples"] == 64
    assert rec["model"] == {"kind": "llama", "dim": 64, "n_layers": 8, "n_heads": 4, "ffn_dim": 128,
                            "vocab_size": 256, "norm_eps": 1e-5, "rope_theta": 10000.0}
    assert (rec["seq_len"], rec["global_batch"], rec["seed"], rec["mesh"], rec["schedule"]) == (64, 16, 0, "1x1x1", "1f1b")
    assert rec["optimizer"] == {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 20, "steps": 6, "weight_decay": 0.1,
                                "max_norm": 1.0}
    assert rec["data"]["name"].startswith("python-stdlib") and rec["data"]["bytes"] > 1_000_000
    assert rec["data"]["files"] == 167  # the pinned module list (train/corpus.py STDLIB_MODULES)
    assert len(rec["data"]["sha256_head"]) == 64
    assert rec["versions"]["torch"].startswith("2.13") and rec["versions"]["python"].count(".") == 2
    assert rec["versions"]["commit"] is None or len(rec["versions"]["commit"]) == 40
    files = {p.name: p.stat().st_size for p in ckpt(base, 4).iterdir() if p.name != "simcluster.json"}
    assert rec["files"] == files and ".metadata" in files and len(files) >= 2


@pytest.mark.parametrize("flags,messages", [
    (["--global-batch", "40"], ["resume: global_batch=40 differs from the checkpoint's 16 (the data order would change",
                                "pass --global-batch 16 to continue it"]),
    (["--n-layers", "4"], ["resume: model n_layers=4 differs from the checkpoint's 8", "pass --n-layers 8 to continue it"]),
    (["--seed", "1", "--seq-len", "32"], ["resume: seed=1 differs from the checkpoint's 0",
                                          "resume: seq_len=32 differs from the checkpoint's 64"]),
    (["--steps", "4"], ["steps: 4 <= the checkpoint's step 4", "pass --steps 5 or more"]),
])
def test_resume_refuses_what_cannot_continue(base, tmp_path, flags, messages):
    """The issue's examples: --global-batch 40 from a run with 16 silently repeated data; an
    8-layer checkpoint resumed with --n-layers 4 trained silently and exited 0."""
    run_dir = tmp_path / "run"
    proc = train("--steps", "8", "--resume", str(ckpt(base, 4)), "--run-dir", str(run_dir), *flags)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    for m in messages:
        assert m in proc.stderr, proc.stderr
    assert str(ckpt(base, 4)) in proc.stderr
    assert not run_dir.exists()


def test_resume_refuses_other_data(base, tmp_path):
    data = tmp_path / "other.txt"
    data.write_text("some other text\n" * 100)
    proc = train("--steps", "8", "--data", str(data), "--resume", str(base), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "resume: data differs from the checkpoint's (bytes" in proc.stderr
    assert "name python-stdlib " in proc.stderr and " -> other.txt" in proc.stderr and "pass the same --data as the saved run" in proc.stderr


def test_changed_hyperparameters_are_applied_and_announced(base, tmp_path):
    proc = ok(train("--steps", "8", "--lr", "0.001", "--weight-decay", "0.05", "--resume", str(ckpt(base, 4)),
                    "--run-dir", str(tmp_path)))
    assert ("[simcluster] resume: hyperparameters changed since the checkpoint, applied: lr 0.003 -> 0.001, "
            "steps 6 -> 8, weight_decay 0.1 -> 0.05") in proc.stdout
    recs = read_metrics(str(tmp_path))
    new = Config(lr=0.001, steps=8, weight_decay=0.05)
    assert [r["step"] for r in recs] == [5, 6, 7, 8]
    assert [r["lr"] for r in recs] == pytest.approx([lr_at(new, s) for s in range(5, 9)], rel=1e-12)
    assert recs[0]["lr"] == pytest.approx(0.001 * 5 / 20)


def test_resume_auto_starts_fresh_then_continues(base, tmp_path):
    """--resume auto in an empty run folder starts at step 1; run again it continues from the
    newest checkpoint, and steps 5-6 equal the uninterrupted run (warmup: lr independent of steps)."""
    first = ok(train("--steps", "4", "--ckpt-every", "2", "--resume", "auto", "--run-dir", str(tmp_path)))
    assert "resumed" not in first.stdout and "\nstep 1/4 loss " in first.stdout
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4]
    second = ok(train("--steps", "6", "--ckpt-every", "2", "--resume", "auto", "--run-dir", str(tmp_path)))
    assert f"resumed from {ckpt(tmp_path, 4)} at step 4" in second.stdout
    recs = {r["step"]: r for r in read_metrics(str(tmp_path))}
    ref = {r["step"]: r for r in read_metrics(str(base))}
    assert sorted(recs) == [1, 2, 3, 4, 5, 6]
    for s in (5, 6):
        assert abs(recs[s]["loss"] - ref[s]["loss"]) <= 1e-6 * ref[s]["loss"], (s, recs[s]["loss"], ref[s]["loss"])


def test_a_folder_named_auto_is_written_dot_slash_auto(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "train", *COMMON, "--resume", "./auto", "--run-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**ENV, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "no complete checkpoint (step-NNNNNN/.metadata) under './auto'" in proc.stderr


@pytest.mark.parametrize("damage,message", [
    ("delete_data", "__0_0.distcp is missing (the checkpoint is partial)"),
    ("truncate_data", "__0_0.distcp has 100 bytes,"),
    ("corrupt_record", "simcluster.json is unreadable or corrupted"),
    ("delete_record", "simcluster.json is missing"),
])
def test_damaged_checkpoint_exits_2_naming_the_file(base, tmp_path, damage, message):
    copy = tmp_path / "checkpoints" / "step-000004"
    shutil.copytree(ckpt(base, 4), copy)
    if damage == "delete_data":
        (copy / "__0_0.distcp").unlink()
    elif damage == "truncate_data":
        with open(copy / "__0_0.distcp", "r+b") as fh:
            fh.truncate(100)
    elif damage == "corrupt_record":
        (copy / "simcluster.json").write_text('{"step": 4, ')
    else:
        (copy / "simcluster.json").unlink()
    proc = train("--steps", "8", "--resume", str(copy), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert f"resume: {copy}" in proc.stderr and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_non_finite_stops_the_run(tmp_path):
    """lr 1e6 without warmup: step 2 zeroes the gradients, step 3's grad norm is nan. The run
    stops there with exit 3 and says why; the step's metrics row is written, no checkpoint."""
    proc = train("--lr", "1e6", "--warmup-steps", "0", "--steps", "6", "--ckpt-every", "3", "--run-dir", str(tmp_path))
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "error: training diverged: grad_norm is nan at step 3; lower --lr (now 1e+06)" in proc.stderr
    recs = read_metrics(str(tmp_path))
    assert [r["step"] for r in recs] == [1, 2, 3] and recs[2]["grad_norm"] != recs[2]["grad_norm"]  # nan
    assert not (tmp_path / "checkpoints" / "step-000003").exists()


def test_non_finite_stops_every_rank(tmp_path):
    """Two dp ranks agree (the loss and norm are all-reduced): each exits 3 or is stopped by torchrun after."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "train", *COMMON,
           "--mesh", "1x2x1", "--lr", "1e6", "--warmup-steps", "0", "--steps", "6", "--run-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=ENV)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-6000:]
    assert "grad_norm is nan at step 3" in out and "exitcode  : 3" in out, out[-6000:]  # the whole tail if not
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]


def test_corrupted_dcp_metadata_exits_2(base, tmp_path):
    """Same size, so preflight's check passes; DCP's own read fails and the run exits 2 naming it."""
    copy = tmp_path / "step-000004"
    shutil.copytree(ckpt(base, 4), copy)
    data = bytearray((copy / ".metadata").read_bytes())
    data[:64] = b"\0" * 64
    (copy / ".metadata").write_bytes(bytes(data))
    proc = train("--steps", "8", "--resume", str(copy), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: rank 0: resume: cannot load the checkpoint {copy} (its .metadata or .distcp files are corrupted)" \
        in proc.stderr
