"""A successful run ends quietly: no store call fails once the rendezvous has gone (issue 17 item 4).

    python -m pytest -q tests/test_quiet_end.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_quiet_end.py    # fails instead

Rules: after ``rendezvous: all nodes exited 0`` no node prints torch's ``recvValue failed``
warning, its C++ ``frame #`` lines or any ``Traceback`` (conftest.NOISE), in the output of
``launcher up`` (stdout and stderr) nor in RUN_DIR/cluster.log. Here: the built-in trainer and a
user script under ``launcher up``; plain ``docker compose up`` and ``docker-compose up`` on a
generated file are checked in tests/test_launcher_compose_config.py, the local node wrappers in
tests/test_launcher_runtime.py. Every cluster runs with --mount-code (this checkout's
launcher/container/ over the image's copy). About 30-60 s on a quiet 2-core machine.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import noise
from simcluster.launcher.handle import Handle

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]


def up_quietly(run_dir: Path, *args: str) -> str:
    """Run ``launcher up --mount-code`` to a successful end; returns its output. Asserts exit 0,
    the rendezvous' all-clear, no NOISE in the output or cluster.log, no container left."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--mount-code", "--run-dir", str(run_dir), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "rendezvous: all nodes exited 0" in out and "== summary: OK ==" in out, out[-5000:]
    log = (run_dir / "cluster.log").read_text(errors="replace")
    assert "rendezvous: all nodes exited 0" in log
    assert noise(out) == [] and noise(log) == [], out[-5000:]
    assert "did not close their store client" not in out, out[-3000:]
    project = Handle.for_run(str(run_dir)).project
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
                          capture_output=True, text=True).stdout.strip()
    assert left == ""
    return out


def test_builtin_trainer_ends_quietly(tmp_path):
    out = up_quietly(tmp_path / "quiet-train", "--mesh", "2x1x1", "--model", "tiny", "--steps", "2")
    assert "final loss" in out


def test_user_script_ends_quietly(tmp_path):
    out = up_quietly(tmp_path / "quiet-ddp", "--nodes", "2", "--nproc-per-node", "1",
                     "--script", "examples/ddp.py", "--", "--steps", "2")
    assert "ddp rank=1" in out
