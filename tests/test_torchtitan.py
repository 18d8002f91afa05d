"""torchtitan's own trainer from PyPI, as published, on simulated GPUs: pp 2 x dp_shard 2 x tp 2 on 2 nodes x
4 ranks, then resumed from its own checkpoint.

    python -m pytest -q -n 0 tests/test_torchtitan.py            # skips without Docker or the image
    CI=true python -m pytest -q -n 0 tests/test_torchtitan.py    # fails instead

examples/frameworks/torchtitan copied to a user's folder outside the repository, its tokenizer and data
made there from the shared corpus (prepare.py), then ``launcher up --code FOLDER --module
torchtitan.train --requirements requirements.txt`` with torchtitan's own command line (the llama3
debug model, seq len 32, 4 steps, a checkpoint every 2): no file of torchtitan changed, no wrapper,
no sitecustomize of the user's, nothing downloaded at run time (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE
through --env). The run ends 0, the loss falls, torchtitan's memory monitor names the simulated
device, its checkpoint of step 4 lands in RUN_DIR/work/outputs/checkpoint; a second ``up`` into the
same run folder with 6 steps loads step 4 and trains steps 5 and 6.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_ends_quietly

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]
EXAMPLE = ROOT / "examples" / "frameworks" / "torchtitan"


def args(steps: int) -> list[str]:
    """torchtitan's own flags, as the example's README gives them, with the step count."""
    text = (EXAMPLE / "README.md").read_text()
    block = re.search(r"```sh\n(python -m launcher up .*?)```", text, re.S).group(1)
    argv = block.replace("\\\n", " ").split()
    argv = argv[argv.index("--") + 1:]
    return [str(steps) if argv[i - 1] == "--training.steps" else a for i, a in enumerate(argv)]


def up(code: Path, run: Path, steps: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--run-dir", str(run), "--nodes", "2",
                           "--nproc-per-node", "4", "--code", str(code), "--module", "torchtitan.train",
                           "--requirements", str(code / "requirements.txt"), "--env", "HF_HUB_OFFLINE=1",
                           "--env", "HF_DATASETS_OFFLINE=1", "--timeout-s", "300", "--", *args(steps)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
    return proc


def losses(out: str) -> dict[int, float]:
    """torchtitan's metrics line (``step:  3  loss:  7.1234 ...``, colour codes between), one loss a step
    (the last stage's ranks print it; the first stage's print -2.0, having none)."""
    by_step: dict[int, float] = {}
    for step, loss in re.findall(r"step:\s*(\d+)\s+\S*loss:\s*([\d.]+)", out):
        assert by_step.setdefault(int(step), float(loss)) == float(loss), out[-3000:]
    return by_step


def test_torchtitan_trains_3d_on_simulated_gpus_and_resumes(tmp_path):
    code = tmp_path / "project"
    shutil.copytree(EXAMPLE, code)
    subprocess.run([sys.executable, str(code / "prepare.py"), str(CORPUS), str(code)], check=True, timeout=120,
                   capture_output=True)
    before = sorted(str(p.relative_to(code)) for p in code.rglob("*"))
    run = tmp_path / "run"

    first = up(code, run, 4)
    out = first.stdout
    by_step = losses(out)
    assert sorted(by_step) == [1, 2, 3, 4] and by_step[4] < by_step[1] * 0.9, by_step
    assert "CUDA capacity: NVIDIA H100 80GB HBM3 with 74.51GiB memory" in out, out[-5000:]  # its memory monitor
    assert f"  final loss   {by_step[4]:g} after 4 steps (as rank 7 printed it)" in out, out[-3000:]  # the last stage
    assert re.search(r"memory:\s+[\d.]+GiB\([\d.]+%\)", out), out[-5000:]  # each step, of the simulated device
    ckpt = run / "work" / "outputs" / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-4"], list(ckpt.iterdir())
    assert len(list((ckpt / "step-4").glob("*.distcp"))) == 8
    assert "simulated GPUs: 4 a node" in out, out[-3000:]
    assert_ends_quietly(out + first.stderr, run)
    assert sorted(str(p.relative_to(code)) for p in code.rglob("*")) == before  # the user's folder untouched

    second = up(code, run, 6)
    assert "Loading the checkpoint from" in second.stdout and "step-4" in second.stdout, second.stdout[-5000:]
    resumed = losses(second.stdout)
    assert sorted(resumed) == [5, 6] and resumed[6] < by_step[1], resumed
    assert "step-6" in {p.name for p in ckpt.iterdir()}
