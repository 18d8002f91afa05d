"""Simulated GPUs (issue 49): a rank of the user's code answers as a GPU of its node, and two
programs written for GPUs train unchanged on 2 nodes x 4 ranks with the losses of their CPU twins.

    python -m pytest -q tests/test_simulated_gpus.py                 # the cluster tests skip without Docker
    CI=true python -m pytest -q tests/test_simulated_gpus.py         # fail instead

On the host: one fresh interpreter with a rank's environment answers every question of the
device (tests/gpu_check.py); the simulation off; FSDP2's divide factor on gloo (2 ranks);
FlexAttention's backward on CPU against SDPA; forked ranks' seeds; bad --gpu and flag
combinations. On containers (--mount-code: this checkout's code), examples/gpu/fsdp_tp.py and
examples/gpu/nd_4d.py on 2 nodes x 4 ranks, 3 steps, each against its twin (its device lines
edited to CPU, in TWINS) under plain torchrun on the host: every rank's loss at every step is equal.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_torch, noise

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "launcher" / "instrument" / "boot"
LOSS = re.compile(r"rank (\d+) step (\d+) loss (\d+\.\d+)(?: |$)")  # in one whole line
INVALID = "CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?"
CHECKED = {"nd_4d.py": ("--check-devices",)}  # run with the mixed-device check: a GPU program passes it as on GPUs
TWINS = {  # the device lines a user edits to run the program on CPUs under plain torchrun
    "fsdp_tp.py": [
        ("    if not torch.cuda.is_available() or torch.cuda.device_count() < 4:\n", "    if False:\n"),
        ("    torch.cuda.set_device(local_rank)\n", ""),
        ('    device = torch.device("cuda", local_rank)\n', '    device = torch.device("cpu")\n'),
        ('    dist.init_process_group("nccl", device_id=device)\n', '    dist.init_process_group("gloo")\n'),
        ('init_device_mesh("cuda",', 'init_device_mesh("cpu",'),
        ("        torch.cuda.synchronize()\n", "")],
    "nd_4d.py": [
        ("from flash_attn import flash_attn_func  # a CUDA-only package: used with --attn flash\n", ""),
        ("    torch.cuda.set_device(local_rank)\n", ""),
        ('    device = torch.device(f"cuda:{local_rank}")\n', '    device = torch.device("cpu")\n'),
        ('    dist.init_process_group(backend="nccl")\n', '    dist.init_process_group(backend="gloo")\n'),
        ('init_device_mesh("cuda",', 'init_device_mesh("cpu",'),
        ('device="cuda"', 'device="cpu"'),
        ("        torch.cuda.synchronize()\n", "")],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}", "SIMCLUSTER_INSTRUMENT": "1", "RANK": "0",
            "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **extra}


TRITON_JIT = """class JITFunction:  # the shape of triton.runtime.jit's: kernel[grid](...) calls run
    def __init__(self, fn):
        self.fn = fn

    def run(self, *args, grid=None, **kwargs):
        return self.fn(*args)
"""


def test_a_rank_answers_as_a_gpu_of_its_node(tmp_path):
    jit = tmp_path / "pkgs" / "triton" / "runtime"
    jit.mkdir(parents=True)
    for init in (jit.parent / "__init__.py", jit / "__init__.py"):
        init.write_text("")
    (jit / "jit.py").write_text(TRITON_JIT)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_check.py"), str(tmp_path / "pkgs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env=rank_env(SIMCLUSTER_GPU="a100-80g", NCCL_DEBUG="INFO"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert (got["available"], got["count"], got["current"], got["accelerator"], got["acc_index"], got["acc_count"]) \
        == (True, 4, 2, "cuda", 2, 4)
    assert got["initial_seed"] == 67280421310721  # CUDA's fixed default seed
    assert got["props"][:6] == ["NVIDIA A100-SXM4-80GB", 80_000_000_000, 8, 0, 108, "NVIDIA A100-SXM4-80GB"]
    assert got["props"][6] == [8, 0] and got["props"][7][1] == 80_000_000_000 and got["props"][7][0] <= 80e9
    assert got["devices"] == ["cpu"]  # every door asked for cuda gave a CPU tensor
    assert got["bad_ordinal"].startswith(f"AcceleratorError: {INVALID}") and got["bad_set_device"] == got["bad_ordinal"]
    assert (got["alloc_delta"], got["freed_delta"]) == (4096, 0)
    assert got["peak_kept"] and got["peak_after_reset"] and got["stats_keys"] and got["reserved_ge"]
    assert got["elapsed_ms_positive"] and got["cuda_seed_repeats"] and got["cuda_state_restores"]
    assert got["autocast_dtype"] == "torch.bfloat16" and got["scaler_step"] == [pytest.approx(0.8)] * 2
    assert (got["backend"], got["mesh"]) == ("gloo", "cpu")
    assert got["ddp"] == ["cpu", None] and got["ddp_bad_id"].startswith(f"AcceleratorError: {INVALID}")
    for key, kernel in (("graph", "CUDA graphs (torch.cuda.CUDAGraph)"), ("scaled_mm", "torch._scaled_mm"),
                        ("flash", "flash_attn.flash_attn_func"), ("triton", "the Triton kernel add_kernel")):
        assert got[key].startswith(f"RuntimeError: {kernel} is a CUDA kernel") and "gpu_check.py:" in got[key] \
            and "Fix: " in got[key], got[key]
    assert "SDPA" in got["flash"] or "scaled_dot_product_attention" in got["flash"]
    assert proc.stderr == "[simcluster] NCCL_DEBUG: no effect on the simulated GPUs (gloo carries the collectives)\n"


def test_the_simulation_off_leaves_torch_as_built(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available(), "
                           "torch.cuda.device_count(), torch.accelerator.current_accelerator())"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=rank_env(SIMCLUSTER_SIMULATED_GPUS="0"))
    assert (proc.stdout, proc.stderr) == ("False 0 None\n", "")


def test_fsdp_divide_factor_sums_then_scales_on_gloo():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "-m", "simcluster.launcher.instrument.fsdp_gloo"], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    # grad of W = sum over ranks of 2 * (rank + 1) per entry = 6, times 16 entries, / factor 4
    lines = sorted(line for line in proc.stdout.splitlines() if line.strip())
    assert proc.returncode == 0 and lines == ["0 24.0", "1 24.0"], (proc.stdout, proc.stderr[-2000:])


def test_flex_attention_backward_on_cpu_equals_sdpa():
    torch = need_torch()
    import torch.nn.attention.flex_attention as flex
    from simcluster.launcher.instrument.flex_cpu import differences, largest_difference

    q = torch.ones(1, 1, 16, 8, requires_grad=True)
    inner = getattr(flex._validate_device, "__simulated__", flex._validate_device)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        inner(q, q, q)  # torch's own check, unbridged
    for causal in (False, True):
        assert largest_difference(causal) <= 5e-7, causal  # relative to each tensor's scale
        for name, (_, flex_exact, sdpa_exact) in differences(causal).items():  # about as close to float64 as SDPA
            assert flex_exact <= 2 * sdpa_exact + 1e-7, (causal, name, flex_exact, sdpa_exact)


def test_forked_ranks_draw_their_own_seeds():
    torch = need_torch()
    from simcluster.train.forked_rank import _fresh_seeds

    draws = []
    for _ in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a forked rank
            _fresh_seeds()
            import random
            os.write(w, json.dumps([random.random(), float(torch.rand(1))]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        draws.append(json.loads(os.read(r, 1000)))
        os.close(r), os.close(w)
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1], draws


@pytest.mark.parametrize("args, problem", [
    (["--script", "examples/ddp.py", "--gpu", "b200"],
     "gpu: must be one of h100-sxm, a100-80g, h100-sxm-8x, a100-80g-8x, h100-96g, h200, got 'b200'"),
    (["--script", "examples/ddp.py", "--no-cpu-bridges"],
     "--no-cpu-bridges: the simulated GPUs need the CPU bridges"),
    (["--script", "examples/ddp.py", "--gpu", "a100-80g", "--no-simulated-gpus", "--no-cpu-bridges"],
     "--gpu a100-80g: no effect with --no-simulated-gpus"),
    (["--no-simulated-gpus"], "--no-simulated-gpus: an option of your own code's runs"),  # the built-in trainer
    (["--script", "examples/ddp.py", "--check-devices", "--no-simulated-gpus", "--no-cpu-bridges"],
     "--check-devices: checks the simulated GPUs' tensors, none with --no-simulated-gpus; drop one"),
    (["--check-devices"], "--check-devices: an option of your own code's runs"),
])
def test_bad_gpu_options_are_refused_with_the_fix(tmp_path, args, problem):
    out = tmp_path / "c.yml"
    layout = ["--nodes", "1", "--nproc-per-node", "1"] if "--script" in args else ["--mesh", "1x1x1"]
    proc = subprocess.run([sys.executable, "-m", "launcher", "generate", *layout, *args, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and problem in proc.stderr and not out.exists(), proc.stderr


def losses(text: str) -> dict:
    """(rank, step) -> loss text, from whole lines only (each rank writes its line in one write)."""
    found = (LOSS.search(line) for line in text.splitlines())
    return {(int(m[1]), int(m[2])): m[3] for m in found if m}


@pytest.mark.docker
@pytest.mark.usefixtures("trainer_image")
def test_gpu_programs_train_unchanged_with_their_twins_losses(tmp_path):
    twins = {}
    for name, edits in TWINS.items():  # the CPU twins run under plain torchrun while the cluster runs
        text = (ROOT / "examples" / "gpu" / name).read_text()
        for old, new in edits:
            assert old in text, (name, old)
            text = text.replace(old, new)
        assert "cuda" not in text.split('"""', 2)[2] and "nccl" not in text.split('"""', 2)[2]
        (tmp_path / name).write_text(text)
        twins[name] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "8", "--master-port", str(free_port()),
             "-m", "simcluster.launcher.instrument.bridges", str(tmp_path / name), "--steps", "3"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    for name in TWINS:
        run = tmp_path / f"run-{name}"
        proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--nodes", "2", "--nproc-per-node", "4",
                               "--script", f"examples/gpu/{name}", "--mount-code", "--run-dir", str(run),
                               *CHECKED.get(name, ()), "--", "--steps", "3"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        log = (run / "cluster.log").read_text(errors="replace")
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert "simulated GPUs: 4 a node (cuda -> cpu, nccl -> gloo), NVIDIA H100 80GB HBM3" in proc.stdout
        assert ("(--check-devices)" in proc.stdout) == (name in CHECKED)
        assert re.search(r"GPU memory +peak of each rank's tensors \(max_memory_allocated\), ranks 0", proc.stdout)
        assert "Unable to locate" not in log and noise(log) == [] and "Warning" not in log, (noise(log), log[-3000:])
        peaks = [json.loads(line)["device_peak_mb"] for r in range(8)
                 for line in (run / "steps" / f"rank-{r}.jsonl").read_text().splitlines()]
        assert len(peaks) == 24 and all(p > 0 for p in peaks)
        twin_out, _ = twins[name].communicate(timeout=600)
        assert twins[name].returncode == 0, twin_out[-3000:]
        sim, cpu = losses(log), losses(twin_out)
        ranks = range(8) if name == "fsdp_tp.py" else range(4, 8)  # nd_4d: the last stage prints
        assert set(sim) == {(r, s) for r in ranks for s in (1, 2, 3)} and sim == cpu, (sim, cpu)
        assert float(sim[(ranks[0], 3)]) < float(sim[(ranks[0], 1)])  # it trains
