"""`pip install .` works in a fresh venv: the host launcher, torch-free, from any folder.

    python -m pytest -q tests/test_packaging.py
"""
from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_pip_install_in_a_fresh_venv(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    py = tmp_path / "venv" / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    has_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode == 0
    assert not has_torch  # the host launcher needs no torch (it is the [torch] extra)
    gen = subprocess.run([str(tmp_path / "venv" / "bin" / "simcluster"), "generate", "--nodes", "2",
                          "--nproc-per-node", "2", "--script", str(ROOT / "examples" / "ddp.py"), "--", "--steps", "3"],
                         cwd=work, capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    out = work / "compose" / "ddp-nodes-2x2.yml"  # written under the folder it runs in
    assert gen.stdout.strip() == "compose/ddp-nodes-2x2.yml" and out.is_file()
    node = yaml.safe_load(out.read_text())["services"]["node-1"]
    assert node["command"][-3:] == ["--", "--steps", "3"]
    assert node["volumes"] == ["../runs/ddp-nodes-2x2:/runs/ddp-nodes-2x2:rw", f"{ROOT}/examples:/code:ro"]
