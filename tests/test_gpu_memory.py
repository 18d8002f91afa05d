"""The simulated GPU's memory (issue 53 items 4 and 5): counted by the compiled allocator, exact for
the rank's tensors in every thread, with CUDA's out-of-memory verdict at the capacity, --gpu-memory,
set_per_process_memory_fraction, caching_allocator_alloc/delete and the history refused by name.

    python -m pytest -q -n 0 tests/test_gpu_memory.py               # the image test skips without Docker
    CI=true python -m pytest -q -n 0 tests/test_gpu_memory.py       # fail instead

One rank's answers (tests/gpu_memory_check.py) in a fresh interpreter on the host (the library built
into the user cache) and in the trainer image (the library the image compiled, /opt/simcluster);
--gpu-memory's refusals through the Python API's request and the command line (exit 2).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_torch

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "launcher" / "instrument" / "boot"
GIB = 2**30
RANK_ENV = {"SIMCLUSTER_INSTRUMENT": "1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "SIMCLUSTER_GPU_MEMORY": str(GIB)}
OOM = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total capacity of 1024.00 MiB of which "
       "424.00 MiB is free. Including non-PyTorch memory, this process has 600.00 MiB memory in use. Of the "
       "allocated memory 600.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.")


def check(got: dict) -> None:
    assert got["kind"] == "allocator" and got["total"] == got["info_total"] == GIB
    assert got["alloc"] == [8192, 0] and got["thread"] == 2**20  # 2 x 4000 B in 512 B blocks; another thread's
    assert got["peak_600"] == 600 * 2**20
    assert got["oom"][0] == "OutOfMemoryError" and got["oom"][1].startswith(OOM), got["oom"]
    assert got["handler_ran"] and got["num_ooms"] == 2 and got["free_after"] == 424 * 2**20 and got["nested"]
    assert got["free_nonnegative"]
    assert got["fraction_type"] == ["TypeError", "Invalid type for fraction argument, must be `float`"]
    assert got["fraction_range"] == ["ValueError", "Invalid fraction value: 1.5. Allowed range: 0~1"]
    assert got["fraction"] == 0.25 and "Tried to allocate 300.00 MiB" in got["fraction_oom"][1]
    assert "256.00 MiB allowed; " in got["fraction_oom"][1] and got["fraction_lifted"] is None
    assert got["raw"] == [1024, 0]
    assert got["history"][0] == "RuntimeError" and "_record_memory_history is not simulated" in got["history"][1]
    assert "Fix: " in got["history"][1] and got["history_off"] is None and "_snapshot" in got["snapshot"][1]


def test_a_rank_counts_at_the_allocator_and_runs_out_at_the_capacity(tmp_path):
    need_torch()
    env = {**os.environ, **RANK_ENV, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}",
           "SIMCLUSTER_CACHE": os.environ.get("SIMCLUSTER_CACHE", str(Path.home() / ".cache" / "simcluster"))}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_memory_check.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-3000:]
    check(json.loads(proc.stdout))


@pytest.mark.docker
def test_the_image_holds_the_allocator(trainer_image):
    image = os.environ.get("SIMCLUSTER_IMAGE", trainer_image)
    env = [a for k, v in RANK_ENV.items() for a in ("-e", f"{k}={v}")]
    proc = subprocess.run(["docker", "run", "--rm", "--read-only", "--cap-drop", "ALL", "-v",
                           f"{ROOT / 'tests'}:/tests:ro", *env, "-e",
                           "PYTHONPATH=/app/simcluster/launcher/instrument/boot:/app", "-w", "/app", image, "python",
                           "/tests/gpu_memory_check.py"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-3000:]
    check(json.loads(proc.stdout))


@pytest.mark.parametrize("given, problem", [
    ({"gpu_memory": "0"}, "--gpu-memory: '0' is 0 bytes; a device holds more than 0, e.g. --gpu-memory 24GiB"),
    ({"gpu_memory": "-1GiB"}, "--gpu-memory: '-1GiB' is -1073741824 bytes; a device holds more than 0"),
    ({"gpu_memory": "75GiB"}, "--gpu-memory: '75GiB' is 80530636800 bytes, above the --gpu h100-sxm model's "
                              "80000000000 bytes (74.51 GiB); give at most that"),
    ({"gpu_memory": "lots"}, "--gpu-memory: 'lots' is not a size; write a number with a unit, e.g. --gpu-memory 24GiB"),
    ({"gpu_memory": "24GiB", "no_simulated_gpus": True, "no_cpu_bridges": True},
     "--gpu-memory 24GiB: no effect with --no-simulated-gpus; drop one"),
])
def test_bad_gpu_memory_is_refused_naming_the_fix(given, problem):
    from simcluster.launcher.job.request import make_request
    from simcluster.core.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        make_request(script="examples/ddp.py", nodes=1, nproc_per_node=2, **given)
    assert problem in str(e.value) and e.value.field == "gpu_memory", str(e.value)
    assert make_request(script="examples/ddp.py", nodes=1, nproc_per_node=2, gpu="a100-80g", gpu_memory="40GB")


def test_gpu_memory_reaches_the_ranks_environment_and_the_command_line_refuses(tmp_path):
    out = tmp_path / "c.yml"
    base = [sys.executable, "-m", "launcher", "generate", "--nodes", "1", "--nproc-per-node", "2", "--script",
            "examples/ddp.py", "--out", str(out)]
    proc = subprocess.run([*base, "--gpu-memory", "24GiB"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and f"SIMCLUSTER_GPU_MEMORY: '{24 * GIB}'" in out.read_text(), proc.stderr
    out.unlink()
    proc = subprocess.run([*base, "--gpu-memory", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--gpu-memory: '0' is 0 bytes" in proc.stderr and not out.exists(), proc.stderr
