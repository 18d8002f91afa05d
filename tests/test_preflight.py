"""Preflight refuses every config that cannot run, before any process group or file exists:
numbers, YAML types, model shapes, data; and validation runs under zbv and dualpipev.

    python -m pytest -q tests/test_preflight.py
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import warm
from simcluster.core.flags import add_config_args, config_from_args
from simcluster.core.config import Config
from simcluster.core.errors import ConfigError
from simcluster.train.corpus import split_sizes
from simcluster.train.preflight import check

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train(*args: str, module: str = "train", timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m module *args``, forked from the worker's warm interpreter (tests/warm.py)."""
    return warm.run(module, list(args), cwd=ROOT, env=ENV, timeout=timeout)


def forkrun(n: int, *args: str) -> subprocess.CompletedProcess:
    """The trainer on n local ranks under forkrun (torchrun's agent, the ranks forked after one
    import, as on a cluster's nodes)."""
    return train("--standalone", f"--nproc-per-node={n}", "-m", "simcluster.train", *args,
                 module="simcluster.train.forkrun")


@pytest.mark.parametrize("overrides,message", [
    ({"lr": float("nan")}, "lr: must be a finite number > 0, got nan"),
    ({"lr": float("inf")}, "lr: must be a finite number > 0, got inf"),
    ({"lr": 0.0}, "lr: must be a finite number > 0, got 0.0"),
    ({"min_lr": -1e-3}, "min_lr: must be a finite number >= 0, got -0.001"),
    ({"weight_decay": float("nan")}, "weight_decay: must be a finite number >= 0, got nan"),
    ({"max_norm": float("inf")}, "max_norm: must be a finite number >= 0, got inf"),
    ({"timeout_s": float("nan")}, "timeout_s: must be a finite number of seconds in (0, 1e+06], got nan"),
    ({"timeout_s": 0.0}, "timeout_s: must be a finite number of seconds in (0, 1e+06], got 0.0"),
    ({"val_fraction": 1.0}, "val_fraction: must be in (0, 1), got 1.0"),
    ({"val_fraction": float("nan")}, "val_fraction: must be in (0, 1), got nan"),
    ({"seed": -1}, "seed: must be in [0, 2**63), got -1"),
    ({"seed": 2**63}, f"seed: must be in [0, 2**63), got {2**63}"),
    ({"log_every": 0}, "log_every: must be >= 1, got 0"),
    ({"val_batches": 0}, "val_batches: must be >= 1, got 0"),
    ({"rank_metrics": 2}, "rank_metrics: must be 0 or 1, got 2"),
    ({"warmup_steps": -1}, "warmup_steps: must be >= 0, got -1"),
    ({"ckpt_keep": -1}, "ckpt_keep: must be >= 0, got -1"),
    ({"microbatches": -2}, "microbatches: must be >= 0, got -2"),
    ({"dim": 0}, "dim: must be >= 1, got 0; omit --dim to take the preset's"),
    ({"n_layers": -1}, "n_layers: must be >= 1, got -1"),
    ({"steps": 0}, "steps: must be >= 1, got 0"),
])
def test_numbers_out_of_range(overrides, message):
    errors = check(Config(**{"model": "tiny", **overrides}))
    assert any(message in e for e in errors), errors


def test_lr_nan_exits_2_in_preflight_listing_every_problem(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("x" * 40)
    run_dir = tmp_path / "run"
    proc = train("--model", "tiny", "--lr", "nan", "--timeout-s", "inf", "--data", str(short), "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "error: preflight failed:"
    assert "lr: must be a finite number > 0, got nan" in lines[1]
    assert "timeout_s: must be a finite number of seconds" in lines[2]
    assert any("training split (38 bytes" in line for line in lines), lines
    assert not run_dir.exists()


def parse_yaml(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    return config_from_args(parser.parse_args(["--config", str(path)]))


def test_yaml_wrong_types_all_listed(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_yaml(tmp_path, "steps: true\nlr: fast\nmax_norm: [1]\nmesh: {pp: 2}\nresume: yes\nwarmup_steps:\nseed: 1.5\n")
    lines = str(e.value).splitlines()
    assert len(lines) == 7, lines
    text = str(e.value)
    assert "field steps must be int, got true (a YAML boolean); write one int value, e.g. steps: 100" in text
    assert "field lr must be float, got 'fast' (text)" in text
    assert "field max_norm must be float, got a list [1]" in text
    assert "field mesh must be str, got a mapping {'pp': 2}" in text
    assert "field resume must be str, got true (a YAML boolean)" in text and "quote it ('yes')" in text
    assert "field warmup_steps is empty; give it a int value (default 20)" in text
    assert "field seed must be an integer, got 1.5" in text


def test_yaml_numbers_accepted(tmp_path):
    """An int for a float field, a whole float for an int field, and PyYAML's text '3e-4' are numbers."""
    cfg = parse_yaml(tmp_path, "lr: 1\nmin_lr: 3e-4\nsteps: 3.0\nrun_dir: 2024\nmodel: tiny\n")
    assert (cfg.lr, cfg.min_lr, cfg.steps, cfg.run_dir) == (1.0, 3e-4, 3, "2024")
    assert type(cfg.lr) is float and type(cfg.steps) is int
    assert check(cfg) == []


def test_yaml_bool_exits_2(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: true\nmodel: tiny\n")
    proc = train("--config", str(path), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "field steps must be int, got true (a YAML boolean)" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_seed_ffn_66_on_tp3_refused_by_parity():
    """The issue's example: every rank crashed in DTensor (the seed preset shards its dim=32 layers)."""
    proc = train("--mesh", "1x1x3", "--model", "seed", "--ffn-dim", "66", "--steps", "3", module="simcluster.train.parity")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "model: dim=32 is not divisible by tp=3 (the seed model shards its dim-wide layers (pair1) over tp)" \
        in proc.stderr
    assert "ffn_dim" not in proc.stderr  # 66 = 3 * 22 splits


@pytest.mark.parametrize("overrides,message", [
    ({"model": "seed", "mesh": "1x1x2", "ffn_dim": 63}, "model: ffn_dim=63 is not divisible by tp=2"),
    ({"model": "tiny", "dim": 72, "n_heads": 8, "ffn_dim": 128},
     "head size dim/n_heads = 72/8 = 9 is odd; RoPE rotates pairs and needs an even head size: use --dim 80"),
])
def test_shapes_refused(overrides, message):
    errors = check(Config(**overrides))
    assert any(message in e for e in errors), errors


def test_shapes_accepted():
    assert check(Config(model="seed", mesh="1x1x2", ffn_dim=66)) == []
    assert check(Config(model="tiny", dim=80, n_heads=8, ffn_dim=128, mesh="1x1x2")) == []


def test_non_utf8_data_refused(tmp_path):
    data = tmp_path / "blob.bin"
    data.write_bytes(b"hello world " * 20 + b"\xff\xfe" + b"x" * 2000)
    errors = check(Config(model="tiny", data=str(data)))
    assert errors == [f"data: {str(data)!r} is not UTF-8 text (invalid byte at offset 240); convert it "
                      f"(e.g. iconv -t UTF-8) or pass a text file with --data"]


def test_40_byte_data_exits_2(tmp_path):
    data = tmp_path / "tiny.txt"
    data.write_text("0123456789" * 4)
    proc = train("--model", "tiny", "--data", str(data), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "has 40 bytes; its training split (38 bytes after holding out val_fraction=0.05) is shorter than one " \
           "window seq_len+1 = 65" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_validation_tail_boundary_same_arithmetic_as_the_loader(tmp_path):
    """seq_len 8, val_fraction 0.1: 90 bytes leave a 9-byte tail (one window): runs and validates;
    89 bytes leave 8: refused up front (it used to train, then die at the first validation)."""
    assert split_sizes(90, 0.1) == (81, 9) and split_sizes(89, 0.1) == (81, 8)
    short, ok = tmp_path / "short.txt", tmp_path / "ok.txt"
    short.write_text("abcdefghi\n" * 8 + "abcdefghi")  # 89 bytes
    ok.write_text("abcdefghi\n" * 9)  # 90 bytes
    common = ["--model", "tiny", "--seq-len", "8", "--global-batch", "2", "--val-fraction", "0.1", "--steps", "1"]
    proc = train(*common, "--data", str(short), "--run-dir", str(tmp_path / "a"))
    assert proc.returncode == 2, proc.stderr
    assert "val_fraction: the validation tail of" in proc.stderr and "is 8 bytes (val_fraction=0.1 of 89), " \
        "shorter than one window seq_len+1 = 9" in proc.stderr
    assert not (tmp_path / "a").exists()
    assert check(Config(model="tiny", seq_len=8, global_batch=2, val_fraction=0.1, data=str(short), val_every=0)) == []
    proc = train(*common, "--data", str(ok), "--run-dir", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads((tmp_path / "b" / "metrics.jsonl").read_text())
    assert rec["step"] == 1 and 4.0 < rec["val_loss"] < 7.0


def val_loss(proc: subprocess.CompletedProcess) -> float:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return float(re.search(r"^step 2/2 .* val_loss (\S+)$", proc.stdout, re.M)[1])


def test_validation_under_zbv_and_dualpipev(tmp_path):
    """The issue's example: a default 2-step 2x1x1 zbv run (validation at the last step) exited 1
    in the schedule's eval and lost its final checkpoint. Now the forward-only path validates,
    with the loss of 1f1b's schedule eval."""
    common = ["--mesh", "2x1x1", "--model", "tiny", "--steps", "2", "--ckpt-every", "2"]
    ref = val_loss(forkrun(2, *common, "--schedule", "1f1b", "--run-dir", str(tmp_path / "1f1b")))
    for schedule in ("zbv", "dualpipev"):
        got = val_loss(forkrun(2, *common, "--schedule", schedule, "--run-dir", str(tmp_path / schedule)))
        assert abs(got - ref) <= 1e-5 * ref, (schedule, got, ref)
        assert (tmp_path / schedule / "checkpoints" / "step-000002" / ".metadata").exists()
    assert 5.0 < ref < 5.6
