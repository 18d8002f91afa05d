"""The catalogue of GPU-only mistakes (issue 53 item 4): each fails on the simulated GPU as a GPU fails
it, its error's type and text asserted. One rank in a fresh interpreter (tests/gpu_mistakes_check.py),
with --check-devices on and off (mixed devices inside a scripted function: CUDA's text after TorchScript's
traceback, as a GPU's interpreter reports it); two ranks on one GPU (NCCL's duplicate-GPU error) are
tests/test_gpu_api.py's torchrun pair.

    python -m pytest -q -n 0 tests/test_gpu_mistakes.py
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import need_torch
from test_gpu_api import ROOT, rank_env

MIXED = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, {} and {}!"
ON_A_GPU = {  # mistake -> what a GPU raises (CUDA's, NCCL's and torch's own words)
    "oom": "OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total capacity of 74.51 GiB",
    "ordinal": "AcceleratorError: CUDA error: invalid device ordinal",
    "visible_count": "AssertionError: 2",  # the program's own CUDA_VISIBLE_DEVICES=0,1 on a node of 4
    "mixed_forward": MIXED.format("cuda:0", "cpu"),
    "mixed_add": MIXED.format("cpu", "cuda:0"),
    "mixed_after_cpu": MIXED.format("cpu", "cuda:0"),
    # inside TorchScript: the op's error after the interpreter's traceback, its first line the interpreter's
    "scripted_mixed": f"{MIXED.format('cuda:0', 'cpu')} ... The following operation failed in the TorchScript "
                      "interpreter.",
    "nccl_cpu": "ValueError: Tensors must be CUDA and dense",
    "moved": None, "scripted_moved": None, "device_of_param": None, "scalar": None, "nccl_cuda": None, "gloo_cpu": None,  # no mistake
}
CHECK_ONLY = ("mixed_forward", "mixed_add", "mixed_after_cpu", "scripted_mixed", "nccl_cpu")  # caught with --check-devices only


def mistakes(check: bool) -> dict:
    from test_simulated_gpus import free_port

    env = rank_env(CUDA_VISIBLE_DEVICES="0,1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   **({"SIMCLUSTER_CHECK_DEVICES": "1"} if check else {}))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_mistakes_check.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("check", [True, False], ids=["check-devices", "default"])
def test_each_gpu_only_mistake_fails_as_on_a_gpu(check):
    need_torch()
    got = mistakes(check)
    want = {k: (None if k in CHECK_ONLY and not check else v) for k, v in ON_A_GPU.items()}
    assert set(got) == set(want), got
    for name, text in want.items():
        assert (got[name] is None) if text is None else got[name].startswith(text), (name, got[name])
