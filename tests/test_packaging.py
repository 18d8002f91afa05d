"""`pip install .` in a fresh venv: the torch-free launcher under its one import name, `simcluster`,
from any folder, beside a user's project whose own `train.py`, `launcher.py` and `train/` never
shadow it; the image builds from the installed package alone.

    python -m pytest -q tests/test_packaging.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from conftest import copy_working_tree

ROOT = Path(__file__).resolve().parent.parent
SHADOWS = {"train.py": "raise RuntimeError(\"the user's train.py was imported\")\n",
           "launcher.py": "raise RuntimeError(\"the user's launcher.py was imported\")\n",
           "train/__init__.py": "raise RuntimeError(\"the user's train package was imported\")\n"}
USER_TEST = '''
import os
import sys


def test_simcluster_imports_beside_my_train():
    import simcluster
    from simcluster.launcher.job import files
    from simcluster.launcher.job.entry import resolve_code
    from simcluster.launcher.job.launch import NodeOptions
    import simcluster.core.config  # ours, under its own name

    launch = resolve_code(NodeOptions(), script="train.py", nodes=2, nproc_per_node=2)
    assert launch.script.endswith("train.py")
    assert "site-packages" in files.SOURCE and files.ROOT == os.getcwd()
    assert os.path.isfile(os.path.join(files.IMAGES, "build.sh"))
    assert "train" not in sys.modules and "launcher" not in sys.modules
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv with this working tree pip-installed, a user project folder)."""
    tmp = tmp_path_factory.mktemp("pkg")
    src = copy_working_tree(tmp / "src")  # the tracked and new files only: no build/ left over from another build
    venv.create(tmp / "venv", with_pip=True)
    py = tmp / "venv" / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src), "pytest==9.0.3"], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    project = tmp / "project"
    for name, text in SHADOWS.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "tests").mkdir()
    (project / "tests" / "test_mine.py").write_text(USER_TEST)
    return py, project


def test_the_installed_launcher_is_torch_free_and_not_shadowed(installed):
    py, project = installed
    assert subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode != 0  # the [torch] extra
    for cmd, out in (([str(py), "-m", "simcluster"], "a"), ([str(py.parent / "simcluster")], "b")):
        gen = subprocess.run([*cmd, "generate", "--mesh", "2x2x2", "--script", "train.py", "--out", f"{out}.yml",
                              "--traffic", "1", "--", "--steps", "3"], cwd=project, capture_output=True, text=True,
                             timeout=120)
        assert gen.returncode == 0, gen.stdout + gen.stderr
        assert "RuntimeError" not in gen.stderr
        node = yaml.safe_load((project / f"{out}.yml").read_text())["services"]["node-1"]
        assert node["command"][:3] == ["python", "-m", "simcluster.launcher.container.node"]
        assert node["command"][-3:] == ["--", "--steps", "3"] and "/code/train.py" in node["command"]
        assert ".:/code:ro" in node["volumes"]  # the project folder (the file's folder) at /code
        assert node["environment"]["SIMCLUSTER_TRAFFIC"] == "1"  # the ranks' instruments, carried by the file
    boot = subprocess.run([str(py), "-c", "import os, simcluster.launcher.instrument as i; print(os.listdir("
                           "os.path.join(os.path.dirname(i.__file__), 'boot')))"], capture_output=True, text=True)
    assert "sitecustomize.py" in boot.stdout, boot.stdout + boot.stderr  # package data of the wheel
    gen = subprocess.run([str(py.parent / "simcluster"), "generate", "--nodes", "2", "--nproc-per-node", "2",
                          "--script", str(ROOT / "examples" / "ddp.py")], cwd=project, capture_output=True, text=True,
                         timeout=120)
    assert gen.returncode == 0 and gen.stdout.strip() == "compose/ddp-nodes-2x2.yml", gen.stderr  # under the cwd
    assert (project / "compose" / "ddp-nodes-2x2.yml").is_file()
    # the user's own pytest run (rootdir = their project, its folder first on sys.path) imports ours
    test = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project,
                          capture_output=True, text=True, timeout=300)
    assert test.returncode == 0 and "1 passed" in test.stdout, test.stdout + test.stderr
    # the plugin registered through the pytest11 entry point: its mark and fixture are there, unasked
    markers = subprocess.run([str(py), "-m", "pytest", "--markers"], cwd=project, capture_output=True, text=True)
    assert "@pytest.mark.simcluster(**defaults)" in markers.stdout, markers.stdout + markers.stderr
    fixtures = subprocess.run([str(py), "-m", "pytest", "--fixtures", "tests"], cwd=project, capture_output=True,
                              text=True)
    assert "simcluster -- " in fixtures.stdout and "simcluster_image [session scope]" in fixtures.stdout, fixtures.stdout


@pytest.mark.docker
def test_the_image_builds_from_the_installed_package(installed, trainer_image, tmp_path):
    """`simcluster build` with no checkout: the installed package's Dockerfile, requirements and
    code; the image imports simcluster's container side and trainer, and carries the digest of the
    installed code, which equals this checkout's (the same files)."""
    py, project = installed
    image = f"simcluster/trainer:pkgtest-{os.getpid()}"
    env = {**os.environ, "SIMCLUSTER_IMAGE": image, "SIMCLUSTER_CACHE": str(tmp_path / "cache")}
    wheels = ROOT / "images" / "wheelhouse"
    if (wheels / ".complete").is_file():  # the checkout's complete wheelhouse, hard-linked: no second download
        (tmp_path / "cache").mkdir()
        subprocess.run(["cp", "-al", str(wheels), str(tmp_path / "cache" / "wheelhouse")], check=True)
    try:
        build = subprocess.run([str(py), "-m", "simcluster", "build"], cwd=project, env=env, capture_output=True,
                               text=True, timeout=1200)
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
        digest = subprocess.run([str(py), "-c", "from simcluster.launcher.job.files import code_digest; "
                                 "print(code_digest())"], cwd=project, capture_output=True, text=True).stdout.strip()
        sys.path.insert(0, str(ROOT))
        from simcluster.launcher.job.files import code_digest

        assert digest == code_digest()
        label = subprocess.run(["docker", "image", "inspect", "-f", '{{index .Config.Labels "io.simcluster.code-digest"}}',
                                image], capture_output=True, text=True).stdout.strip()
        assert label == digest
        probe = subprocess.run(["docker", "run", "--rm", image, "python", "-c",
                                "import simcluster.launcher.container.node, simcluster.train.trainer, simcluster; "
                                "print(simcluster.__file__)"], capture_output=True, text=True, timeout=300)
        assert probe.returncode == 0 and probe.stdout.strip() == "/app/simcluster/__init__.py", probe.stderr
        boot = subprocess.run(["docker", "run", "--rm", "-w", "/app/simcluster/launcher/instrument/boot", image,
                               "find", ".", "-type", "f"], capture_output=True, text=True, timeout=300)
        files = sorted(boot.stdout.split())  # the ranks' instruments, and their bytecode compiled at build
        assert files[1:] == ["./sitecustomize.py"] and re.fullmatch(r"\./__pycache__/sitecustomize\.cpython-\d+\.pyc",
                                                                     files[0]), boot.stdout + boot.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
