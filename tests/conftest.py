"""Shared pytest setup: the ``docker`` marker and the check that Docker is there.

    python -m pytest -q tests                 # docker tests skip where Docker is missing ...
    CI=true python -m pytest -q tests         # ... and fail instead under CI=true
    python -m pytest -q -m "not docker" tests # everything that needs no Docker

Other fixtures may be added below; keep this file free of torch imports.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "docker: needs a Docker engine and compose (skipped without, fails if CI=true)")


def _docker_problem() -> str | None:
    """None when `docker info` answers and a compose CLI exists, else what is missing."""
    if not shutil.which("docker"):
        return "docker CLI not installed"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "Docker engine not reachable (`docker info` failed)"
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode == 0
    if not v2 and not shutil.which("docker-compose"):
        return "neither `docker compose` nor `docker-compose` installed"
    return None


def need(problem: str | None) -> None:
    """Skip the test for a missing prerequisite, or fail it when env CI=true."""
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="session")
def docker_available() -> None:
    """Use in tests marked ``@pytest.mark.docker``: skips (or fails under CI=true) without Docker."""
    need(_docker_problem())


@pytest.fixture(scope="session")
def trainer_image(docker_available) -> str:
    """The trainer image name; skips (fails under CI=true) when it is not built (bash images/build.sh)."""
    image = "simcluster/trainer:latest"
    ok = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60).returncode == 0
    need(None if ok else f"image {image} missing: bash images/build.sh")
    return image


def need_torch():
    """torch on the host, for tests that run the single-process reference: skips without it,
    fails when env CI=true (CI installs it from requirements-dev.txt)."""
    try:
        import torch
    except ImportError:
        need("torch is not installed on the host: python -m pip install -r requirements-dev.txt")
    return torch
