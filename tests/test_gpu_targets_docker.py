"""The same file runs here first (issue 55), on Docker: a GPU program's batch script runs unchanged on the simulated
Slurm, its GPU request granted, with the losses of `up`; `generate --push` to a registry on this machine.

    CI=true OMP_NUM_THREADS=1 python -m pytest -q -n 0 tests/test_gpu_targets_docker.py

The GPU program is examples/gpu/fsdp_tp.py (nccl, ``cuda:LOCAL_RANK``, a "cuda" DeviceMesh), packed as the
module ``scgpu.fsdp_tp`` of a wheel made here (a wheel is a zip: the module, METADATA, WHEEL, RECORD), so that
both runs take it from the derived image of ``--wheel`` (a batch script runs code from its image or the
cluster's shared folder, never a bind mount). The registry is Debian's docker-registry (``apt-get install
docker-registry``) on 127.0.0.1 (Docker pushes over plain http to a loopback registry).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import need

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.docker
LOSS = re.compile(r"rank (\d+) step (\d+) loss (\S+)")


def gpu_wheel(folder: Path) -> Path:
    """scgpu-1.0-py3-none-any.whl holding examples/gpu/fsdp_tp.py as scgpu/fsdp_tp.py."""
    files = {"scgpu/__init__.py": b"", "scgpu/fsdp_tp.py": (ROOT / "examples" / "gpu" / "fsdp_tp.py").read_bytes(),
             "scgpu-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: scgpu\nVersion: 1.0\n",
             "scgpu-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}"
              for n, b in files.items()]
    files["scgpu-1.0.dist-info/RECORD"] = ("\n".join([*record, "scgpu-1.0.dist-info/RECORD,,"]) + "\n").encode()
    path = folder / "scgpu-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def _losses(text: str) -> dict[tuple[int, int], str]:
    return {(int(r), int(s)): v for r, s, v in LOSS.findall(text)}


def _up(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "up", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_gpu_program_batch_script_runs_on_the_simulated_slurm_with_ups_losses(trainer_image, tmp_path):
    wheel = gpu_wheel(tmp_path)
    job = ("--nodes", "2", "--nproc-per-node", "4", "--wheel", str(wheel), "--module", "scgpu.fsdp_tp", "--gpu",
           "a100-80g")
    slurm = _up("--target", "slurm", *job, "--run-dir", str(tmp_path / "slurm"), "--", "--steps", "2")
    assert slurm.returncode == 0, slurm.stdout[-4000:] + slurm.stderr[-2000:]
    script = (tmp_path / "slurm" / "job.sbatch").read_text()
    generated = subprocess.run([sys.executable, "-m", "launcher", "generate", "--target", "slurm", *job, "--run-dir",
                                str(tmp_path / "slurm"), "--stdout", "--", "--steps", "2"], cwd=ROOT, capture_output=True,
                               text=True, timeout=300)
    body = lambda text: [l for l in text.splitlines() if not l.startswith("# Regenerate")]  # noqa: E731
    assert body(script) == body(generated.stdout), "up ran another file than generate writes"
    assert "#SBATCH --gpus-per-node=a100:4" in script and "CUDA_VISIBLE_DEVICES" not in script
    log = (tmp_path / "slurm" / "cluster.log").read_text(errors="replace")
    assert "COMPLETED (exit 0:0) on 2 nodes" in slurm.stdout
    compose = _up(*job, "--run-dir", str(tmp_path / "compose"), "--", "--steps", "2")
    assert compose.returncode == 0, compose.stdout[-4000:]
    got, want = _losses(log), _losses((tmp_path / "compose" / "cluster.log").read_text(errors="replace"))
    assert set(got) == {(r, s) for r in range(8) for s in (1, 2)} and got == want, (got, want)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def registry(tmp_path):
    """Debian's docker-registry serving 127.0.0.1:PORT from tmp_path (the address, as --push takes it)."""
    binary = shutil.which("docker-registry")
    need(None if binary else "docker-registry is not installed: apt-get install docker-registry")
    port = _free_port()
    conf = tmp_path / "registry.yml"
    conf.write_text(yaml.safe_dump({"version": 0.1, "log": {"level": "error"},
                                    "storage": {"filesystem": {"rootdirectory": str(tmp_path / "store")}},
                                    "http": {"addr": f"127.0.0.1:{port}"}}))
    proc = subprocess.Popen([binary, "serve", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_push_tags_pushes_and_names_the_image(registry, docker_available):
    small = "simcluster/nettools:latest"  # a small local image: what is pushed does not matter, its name does
    need(None if subprocess.run(["docker", "image", "inspect", small], capture_output=True).returncode == 0
         else f"{small} missing (python -m launcher up --inter-node-bandwidth builds it)")
    target = f"{registry}/simcluster/nettools:latest"
    try:
        proc = subprocess.run([sys.executable, "-m", "launcher", "generate", "--target", "jobset", "--nodes", "2",
                               "--nproc-per-node", "4", "--module", "m", "--image", small, "--push", registry,
                               "--stdout"], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        pod = yaml.safe_load(proc.stdout)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == target and f"docker push {target}" in proc.stderr
        tags = json.load(urllib.request.urlopen(f"http://{registry}/v2/simcluster/nettools/tags/list", timeout=5))
        assert tags == {"name": "simcluster/nettools", "tags": ["latest"]}
    finally:
        subprocess.run(["docker", "image", "rm", "--no-prune", target], capture_output=True)
