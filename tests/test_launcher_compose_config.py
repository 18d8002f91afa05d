"""Docker tests of the launcher: compose accepts every generated file; a probe cluster runs.

    python -m pytest -q tests/test_launcher_compose_config.py           # skips without Docker
    CI=true python -m pytest -q tests/test_launcher_compose_config.py   # fails without Docker

``config`` runs with both Compose versions (``docker compose`` v2 and ``docker-compose`` v1). The cluster tests need the image simcluster/trainer:latest (bash images/build.sh) and
run launcher/container/probe.py in place of the trainer with the working tree mounted (--mount-code).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import COMPOSE_V1, COMPOSE_V2, noise

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_available")]


def compose_clis() -> list[list[str]]:
    return [COMPOSE_V2.split(), COMPOSE_V1.split()]


def generated_files(tmp: Path) -> list[Path]:
    """The committed files, a trainer variant that sets every node option, data and run folder, and
    a user-code variant (a script with its arguments and a mount, on nodes x ranks)."""
    files = [ROOT / "docker-compose.yml", *sorted((ROOT / "compose").glob("mesh-*.yml"))]
    extra, code = tmp / "everything.yml", tmp / "script.yml"
    subprocess.run([sys.executable, "-m", "launcher", "generate", "--mesh", "12x1x1", "--model", "tiny",
                    "--n-layers", "12", "--microbatches", "12", "--global-batch", "12", "--data", "tests/golden",
                    "--run-dir", str(tmp / "run$HOME"), "--cpus-per-node", "1.5", "--memory-per-node", "2g",
                    "--mount-code", "--rdzv-backend", "static", "--out", str(extra)],
                   cwd=ROOT, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "launcher", "generate", "--nodes", "3", "--nproc-per-node", "2",
                    "--script", "examples/ddp.py", "--mount", "tests/golden:/data/golden", "--out", str(code), "--",
                    "--steps", "3"], cwd=ROOT, check=True, capture_output=True)
    return files + [extra, code]


def test_compose_config_accepts_generated_files(tmp_path):
    clis = compose_clis()
    assert clis
    for cli in clis:
        for f in generated_files(tmp_path):
            proc = subprocess.run([*cli, "-f", str(f), "config"], cwd=f.parent, capture_output=True, text=True)
            assert proc.returncode == 0, f"{' '.join(cli)} config {f}: {proc.stderr}"
            assert "variable is not set" not in proc.stderr
            if f.name == "everything.yml":  # its run folder is named run$HOME: a literal $, not interpolated
                assert "run$HOME" in proc.stdout.replace("$$", "$") and os.environ["HOME"] not in proc.stdout


def test_launcher_up_probe_cluster(tmp_path, trainer_image):
    """2 nodes x 2 ranks: node k gets ranks 2k, 2k+1; all exit 0; summary OK; cluster removed."""
    run = tmp_path / "probe-run"
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--mesh", "2x2x1", "--module", "simcluster.launcher.container.probe",
                           "--mount-code", "--run-dir", str(run)], cwd=ROOT, capture_output=True, text=True,
                          timeout=580)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    for rank, node in ((0, "node-0"), (1, "node-0"), (2, "node-1"), (3, "node-1")):
        assert f"probe rank={rank} local_rank={rank % 2} world_size=4 host={node}" in out
    assert "== summary: OK ==" in out and "rank output  4/4 ranks printed" in out and "MISPLACED" not in out
    assert "rendezvous: all nodes exited 0" in out
    assert (run / "compose.yml").is_file() and (run / "cluster.log").is_file()
    assert noise(out + proc.stderr) == [] and noise((run / "cluster.log").read_text(errors="replace")) == [], out
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=sc-probe-run"],
                          capture_output=True, text=True).stdout.strip()
    assert left == ""


@pytest.mark.parametrize("cli", [COMPOSE_V2, COMPOSE_V1])
@pytest.mark.parametrize("fail", [False, True], ids=["ok", "rank-fails"])
def test_plain_compose_up_exit_code_from_rendezvous(tmp_path, trainer_image, cli, fail):
    """The CI command with plain Compose, `compose up --exit-code-from rendezvous`: exit 0 when
    every node succeeded, 1 when a rank failed (the nodes stay until the rendezvous' verdict, so
    the rendezvous exits first); every container ends. A success ends quietly: no store call
    fails after the rendezvous has gone (conftest.NOISE)."""
    run = tmp_path / "plain-run"
    run.mkdir()
    os.chown(run, 1000, 1000) if os.getuid() == 0 else None
    file = tmp_path / "plain.yml"
    subprocess.run([sys.executable, "-m", "launcher", "generate", "--mesh", "2x1x1", "--module",
                    "simcluster.launcher.container.probe", "--mount-code", "--run-dir", str(run), "--out", str(file)],
                   cwd=ROOT, check=True)
    files = ["-f", str(file)]
    if fail:
        override = tmp_path / "override.yml"
        override.write_text('services:\n  node-1:\n    environment:\n      PROBE_FAIL_RANK: "1"\n')
        files += ["-f", str(override)]
    project = f"scplain{'fail' if fail else 'ok'}{cli.replace(' ', '').replace('-', '')}"
    base = [*cli.split(), "-p", project, *files]
    try:
        proc = subprocess.run([*base, "up", "--no-color", "--exit-code-from", "rendezvous"], capture_output=True,
                              text=True, timeout=400)
        out = proc.stdout + proc.stderr
        assert proc.returncode == (1 if fail else 0), out[-4000:]
        assert ("rendezvous: FAILED" if fail else "rendezvous: all nodes exited 0") in out
        if fail:
            assert "failing on purpose" in out
        else:
            assert noise(out) == [], out[-4000:]
        states = subprocess.run(["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
                                 "--format", '{{.Label "com.docker.compose.service"}}={{.State}}'],
                                capture_output=True, text=True).stdout.split()
        assert sorted(states) == ["node-0=exited", "node-1=exited", "rendezvous=exited"]
    finally:
        subprocess.run([*base, "down", "-t", "1"], capture_output=True)
