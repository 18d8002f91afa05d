"""torch.compile inside the cluster's containers, and the stall watch around it.

    python -m pytest -q tests/test_compile.py

One cluster (2 nodes x 1 rank, the simulated GPUs, --stall-s 5) runs examples/compile.py: a DDP model
compiled with torch.compile beside its eager twin, every rank sleeping 3 stall limits after step 1.
In each container (read-only root, /tmp a noexec tmpfs) inductor builds and loads its kernels from
RUN_DIR/compile-cache/NODE/; compiled and eager losses agree; the first compile (tens of seconds on
2 cores, more than the limit, one rank waiting for the other's) and the pause are no hang: exit 0,
a note. Without Docker: the cache's environment, and triton kept off CPU code in a rank.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_torch, noise

from simcluster.launcher.container.compile_cache import cache_env

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "launcher" / "instrument" / "boot"


def test_each_node_gets_its_compile_cache_in_the_run_folder_unless_the_job_sets_one():
    assert cache_env({}, "/runs/x", "node-1") == {"TORCHINDUCTOR_CACHE_DIR": "/runs/x/compile-cache/node-1/inductor",
                                                   "TRITON_CACHE_DIR": "/runs/x/compile-cache/node-1/triton"}
    assert cache_env({"TRITON_CACHE_DIR": "/own"}, "/runs/x", "node-0")["TRITON_CACHE_DIR"] == "/own"
    assert cache_env({}, None, "node-0") == {}


@pytest.mark.parametrize("own, expected", [(None, "1 True"), ("0", "0 False")])
def test_a_rank_keeps_inductor_off_triton_devices_unless_its_environment_says(tmp_path, own, expected):
    """A rank with the simulated GPUs (torch.cuda.is_available() True): inductor's triton device
    detection off in its environment (its compile workers inherit it) and config; a program's own value wins."""
    need_torch()
    env = {**os.environ, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}", "SIMCLUSTER_INSTRUMENT": "1", "RANK": "0",
           "SIMCLUSTER_OUTPUT_DIR": str(tmp_path)}
    env.pop("TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION", None)
    if own is not None:
        env["TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION"] = own
    code = ("import os, torch, torch._inductor.config as c; assert torch.cuda.is_available(); "
            "print(os.environ['TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION'], c.triton_disable_device_detection)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == expected, proc.stdout + proc.stderr


@pytest.mark.docker
def test_compile_in_every_container_equals_eager_and_is_no_hang(tmp_path, trainer_image):
    import simcluster

    folder = tmp_path / "compile"
    run = simcluster.run(script=str(ROOT / "examples" / "compile.py"), nodes=2, nproc_per_node=1, stall_s=5,
                         run_dir=str(folder), args=["--steps", "3", "--pause-s", "15"])
    assert run.ok and run.exit_code == 0, run.summary
    log = (folder / "cluster.log").read_text()
    steps = re.findall(r"r0 +\| step (\d) loss ([\d.]+) eager ([\d.]+)", log)
    assert [int(s) for s, _, _ in steps] == [1, 2, 3], log[-3000:]
    for _, compiled, eager in steps:  # inductor's fused CPU kernels against the eager ops: float32 rounding
        assert abs(float(compiled) - float(eager)) <= 1e-5 * abs(float(eager)), steps
    graphs = re.search(r"compiled graphs (\d+)", log)
    assert graphs and int(graphs.group(1)) >= 1, log[-3000:]
    for node in ("node-0", "node-1"):  # each node built and loaded its kernels from the run folder
        assert list((folder / "compile-cache" / node / "inductor").rglob("*.so")), node
    assert "[simcluster] note: no rank progressed for " in log and "so this is no hang" in log, log[-3000:]
    assert not (folder / "hang.json").exists()
    assert noise(log) == [] and "Warning" not in log, (noise(log) or [line for line in log.splitlines()
                                                                      if "Warning" in line])[:5]
    assert f"  final loss   {float(steps[-1][1])} after 3 steps" in run.summary, run.summary
