"""Real frameworks from PyPI on the cluster, each with its dependencies by one flag (--requirements), nothing
changed but its device, a DCP checkpoint saved to a relative path; and the docs' own-image recipe, built.

    python -m pytest -q tests/test_frameworks.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_frameworks.py    # fails instead

Lightning Fabric's ModelParallelStrategy (tensor parallel x FSDP2, launched through its own strategy
and accelerator objects) and a Hugging Face transformers GPT-2 built from its config and split into
torch.distributed.pipelining stages, each on 2 nodes x 2 ranks from a folder outside the repository:
the run ends 0, the loss falls, the checkpoint of all 4 ranks lands in RUN_DIR/work/checkpoint, the
user's folder is untouched, the summary names the derived image, and asking for the same
requirements again builds nothing; and HF accelerate's ND parallelism (ParallelismConfig: HSDP x FSDP2 x TP,
bf16) on 2 nodes x 4 simulated GPUs: accelerate sees 8 processes and cuda, the loss falls. The first build
downloads the wheels (pip, from the registry).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_ends_quietly

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]


def run_example(name: str, tmp_path: Path, *args: str, nproc: int = 2,
                launcher_args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The example copied to a user's folder outside the repo, run with `launcher up --requirements` on 2 nodes
    of nproc ranks, launcher_args before the script's args."""
    code = tmp_path / "project"
    shutil.copytree(ROOT / "examples" / "frameworks" / name, code)
    before = sorted(p.name for p in code.iterdir())
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--run-dir", str(run), "--nodes", "2",
                           "--nproc-per-node", str(nproc), "--script", str(code / "train.py"), "--requirements",
                           str(code / "requirements.txt"), *launcher_args, "--", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in code.iterdir()) == before  # the user's folder is never written
    return proc, run, code


def check_run(proc: subprocess.CompletedProcess, run: Path, steps: int) -> None:
    """Losses falling, 4 ranks' checkpoint shards in the shared working directory, the image named."""
    by_step = {}  # Fabric.print prints on each node's local rank 0: one loss a step, as often as nodes
    for step, loss in re.findall(rf"step (\d+)/{steps} loss ([\d.]+)", proc.stdout):
        assert by_step.setdefault(int(step), float(loss)) == float(loss), proc.stdout[-3000:]
    losses = [by_step[s] for s in sorted(by_step)]
    assert sorted(by_step) == list(range(1, steps + 1)) and losses[-1] < losses[0] * 0.9, losses
    shards = sorted(p.name for p in (run / "work" / "checkpoint").iterdir())
    assert [s for s in shards if s.endswith(".distcp")] == [f"__{r}_0.distcp" for r in range(4)], shards
    record = json.loads((run / "summary.json").read_text())
    assert record["ok"] and record["image"].startswith("simcluster/deps:"), record
    assert f"  image        {record['image']} (FROM the trainer image, with your requirements)" in proc.stdout
    assert_ends_quietly(proc.stdout + proc.stderr, run)


def test_lightning_fabric_2d_tp_fsdp2_with_its_requirements(tmp_path):
    from simcluster.launcher.engines.deps_image import ensure
    from simcluster.launcher.job.deps import Requirements

    proc, run, code = run_example("lightning_2d", tmp_path, "--steps", "6")
    check_run(proc, run, 6)
    assert "meta.pt" in {p.name for p in (run / "work" / "checkpoint").iterdir()}  # Fabric's own metadata
    assert "may not have complete support on cpu device mesh" not in proc.stdout + proc.stderr  # the RNG bridge
    record = json.loads((run / "summary.json").read_text())
    lines: list[str] = []  # reused, not rebuilt: said so (no time bound: Docker answers slowly on a busy machine)
    assert ensure(Requirements(str(code / "requirements.txt")), say=lines.append) == record["image"]
    assert lines == [f"image: {record['image']} (your requirements, built before)"]


def test_transformers_gpt2_pipeline_with_its_requirements(tmp_path):
    proc, run, _ = run_example("hf_pipeline", tmp_path, "--steps", "6")
    check_run(proc, run, 6)


def test_the_docs_own_image_recipe_builds_and_runs(tmp_path):
    """docs/own-code.md's Dockerfile FROM the trainer image, as written there, with one wheel its `pip
    download` line fetches: the build succeeds and the package imports beside torch; the same line's
    flags fetch torch 2.13.0+cpu itself (a manylinux_2_28 wheel)."""
    doc = (ROOT / "docs" / "own-code.md").read_text()
    block = re.search(r"\n( +)FROM simcluster/trainer:latest\n(?:\1.*\n)+", doc).group(0)
    (tmp_path / "Dockerfile").write_text("\n".join(line.strip() for line in block.strip().splitlines()) + "\n")
    (tmp_path / "constraints.txt").write_text("torch==2.13.0+cpu\n")
    (tmp_path / "requirements.txt").write_text("tqdm\n")
    line = re.search(r"`(pip download -d wheels .*?)`", doc, re.S).group(1).split()
    env = {**os.environ, "PIP_RETRIES": "0"}  # an index this machine cannot reach is skipped at once
    subprocess.run([sys.executable, "-m", *line], cwd=tmp_path, check=True, timeout=300, env=env)
    torch_only = [a if a != "wheels" else "torch-wheel" for a in line[:line.index("-c")]]
    subprocess.run([sys.executable, "-m", *torch_only, "--no-deps", "torch==2.13.0+cpu"], cwd=tmp_path, check=True,
                   timeout=600, env=env)  # the docs' flags fetch the image's own torch (tagged manylinux_2_28)
    assert [p.name for p in (tmp_path / "torch-wheel").iterdir()] == [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    tag = "simcluster/test-own-image:latest"
    build = subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    try:
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "python", "-c",
                              "import tqdm, torch, os; print(tqdm.__name__, torch.__version__, os.getuid())"],
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.split() == ["tqdm", "2.13.0+cpu", "1000"], out.stdout + out.stderr
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_accelerate_nd_parallel_hsdp_fsdp2_tp_on_simulated_gpus(tmp_path):
    """accelerate's ParallelismConfig (dp_replicate 2 x dp_shard 2 x tp 2) with bf16 autocast, 2 nodes x 4 ranks:
    accelerate finds 4 CUDA devices a node and a world of 8 (with --no-simulated-gpus it raises "total_size (8)
    does not match num_processes (1)"), and the loss falls."""
    data = ROOT.parent / "shared" / "data"  # tinyshakespeare.txt beside the repository, as examples/llama_2d.py reads it
    proc, run, _ = run_example("accelerate_nd", tmp_path, "--steps", "6", nproc=4,
                               launcher_args=("--mount", f"{data}:/data"))
    assert "accelerate: FSDP on cuda, 8 processes, mesh {'dp_replicate': 2, 'dp_shard': 2, 'tp': 2}" in proc.stdout
    losses = [float(x) for x in re.findall(r"r0 +\| step \d+/6 loss ([\d.]+)", proc.stdout)]
    assert len(losses) == 6 and losses[-1] < losses[0] * 0.8, losses
    assert "  simulated GPUs: 4 a node (cuda -> cpu, nccl -> gloo)" in proc.stdout, proc.stdout[-3000:]
    record = json.loads((run / "summary.json").read_text())
    assert record["ok"] and record["image"].startswith("simcluster/deps:"), record
    assert_ends_quietly(proc.stdout + proc.stderr, run)
