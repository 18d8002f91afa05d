"""Shared pytest setup: the ``docker`` marker, the check that Docker is there, the Compose choice.

    python -m pytest -q tests                 # docker tests skip where Docker is missing ...
    CI=true python -m pytest -q tests         # ... and fail instead under CI=true
    python -m pytest -q -m "not docker" tests # everything that needs no Docker

Every cluster test runs under Compose v2 (``docker compose``), chosen explicitly through the
launcher's SIMCLUSTER_COMPOSE for the whole session; a test that wants v1 passes
``compose_env(COMPOSE_V1)`` to its `launcher up`. Keep this file free of torch imports.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

# A shell starts a background job (`pytest ... &`) with SIGINT ignored, and every process it starts
# inherits that: the Ctrl-C drills' `up` would ignore the test's SIGINT and train to its last step.
# Python's own handler here means the children start with the default (a handler is reset at exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

COMPOSE_V2 = "docker compose"
COMPOSE_V1 = "docker-compose"
os.environ["SIMCLUSTER_COMPOSE"] = COMPOSE_V2  # inherited by every `python -m launcher` a test starts
# the planner's `local` calibration: this session's own file, never the developer's cache, one for the
# controller and all its xdist workers (they inherit it; calibrated once, on first use, under its lock)
if "PYTEST_XDIST_WORKER" not in os.environ or "SIMCLUSTER_TEST_CACHE" not in os.environ:
    os.environ["SIMCLUSTER_TEST_CACHE"] = tempfile.mkdtemp(prefix="simcluster-cache-")
    atexit.register(shutil.rmtree, os.environ["SIMCLUSTER_TEST_CACHE"], True)
os.environ["SIMCLUSTER_CACHE"] = os.environ["SIMCLUSTER_TEST_CACHE"]
# What a successful run's log must not hold: a store call failing once the rendezvous has closed
# (torch's warning and C++ frames, issue 17 item 4), any Python traceback, or the instruments'
# boot failing in a rank of the user's code (launcher/instrument/boot/sitecustomize.py).
NOISE = ("Exception raised from", "frame #", "recvValue failed", "Traceback", "instruments not installed")


def noise(text: str) -> list[str]:
    """The lines of text holding any of NOISE (empty for a quiet log)."""
    return [line for line in text.splitlines() if any(m in line for m in NOISE)]


def noise_context(text: str, before: int = 6) -> str:
    """The lines before the first NOISE line and the next few: what printed it (an assertion's message;
    a tail of the log can show only a C++ stack's last frames)."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if any(m in line for m in NOISE)), None)
    return "" if first is None else "\n".join(lines[max(0, first - before):first + 4])


def assert_ends_quietly(out: str, run_dir: Path) -> None:
    """A successful run ends quietly (issue 17 item 4): the rendezvous' all-clear in ``up``'s output
    and in RUN_DIR/cluster.log, no NOISE in either, no rank that left its store client open."""
    log = (run_dir / "cluster.log").read_text(errors="replace")
    assert "rendezvous: all nodes exited 0" in out and "rendezvous: all nodes exited 0" in log, out[-5000:]
    assert noise(out) == [] and noise(log) == [], noise(out + log)[:5]
    assert "did not close their store client" not in out, out[-3000:]


def compose_env(cli: str) -> dict[str, str]:
    """This process's environment with the launcher's Compose set to cli (COMPOSE_V1 or COMPOSE_V2)."""
    return {**os.environ, "SIMCLUSTER_COMPOSE": cli}


def copy_working_tree(dest: Path) -> Path:
    """Copy this checkout's tracked and new (not ignored) files to dest and return dest: a source tree
    for `pip install` / `pip wheel` with no build/ folder of an earlier build (whose stale modules
    setuptools would pack)."""
    root = Path(__file__).resolve().parent.parent
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in names:
        if (root / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, dest / name)
    return dest


def pytest_configure(config):
    config.addinivalue_line("markers", "docker: needs a Docker engine and compose (skipped without, fails if CI=true)")


# The files whose tests take longest (CI's --durations on 2 cores, 2 Dec 2026: about 470 s of
# parity runs, then the fault drills, the user's code, the workflow template, ...; on 4 Dec the
# checkpoint, compose-config and runtime files, 66-85 s each, joined the end of the list), longest
# first. Under `--dist loadfile` (pyproject.toml) xdist hands out whole files in collection order, so
# these go first: a long file taken last keeps one worker busy while the others have nothing left.
# Only the order changes; a file missing here runs after them, in the usual order. test_swarm.py
# is left out on purpose: it holds the engine alone (_engine_share below), which among the short
# files at the end makes the other workers wait least (among the long Docker files: 52 s and 43 s).
LONGEST_FIRST = ("test_parity.py", "test_faults.py", "test_user_code.py", "test_ci_templates.py", "test_torchtitan.py",
                 "test_sweep.py", "test_simulated_gpus.py", "test_hang.py", "test_compare.py",
                 "test_checkpoint_faults.py", "test_cluster.py", "test_traffic.py", "test_engines_docker.py",
                 "test_plugin.py", "test_packaging.py", "test_plan.py", "test_checkpoint.py",
                 "test_launcher_compose_config.py", "test_launcher_runtime.py")


@pytest.fixture(scope="module", autouse=True)
def _engine_share(request):
    """A lock on the engine per test file that uses Docker: shared, except in a file that sets
    ``ENGINE_EXCLUSIVE = True`` (test_swarm.py): `docker swarm leave` (Docker 20.10) stops the
    embedded DNS of every other network on the engine, so a cluster of the other worker that
    looks a name up afterwards (Slurm's daemons do all the time) hangs. Taken before the file's
    own module fixtures bring up their clusters; one file for the whole machine, so concurrent
    sessions share it too."""
    if not any(item.get_closest_marker("docker") or {"docker_available", "trainer_image"} & set(item.fixturenames)
               for item in request.session.items if item.module is request.module):
        yield
        return
    import fcntl

    with open(Path(tempfile.gettempdir()) / f"simcluster-engine-{os.getuid()}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if getattr(request.module, "ENGINE_EXCLUSIVE", False) else fcntl.LOCK_SH)
        yield


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def _docker_problem() -> str | None:
    """None when `docker info` answers and both Compose versions are installed, else what is missing."""
    if not shutil.which("docker"):
        return "docker CLI not installed"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "Docker engine not reachable (`docker info` failed)"
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode != 0:
        return "Compose v2 (`docker compose`) not installed: bash .ci/docker-up.sh"
    if not shutil.which("docker-compose"):
        return "Compose v1 (`docker-compose`) not installed: bash .ci/docker-up.sh"
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


def reference_losses(mesh: str, steps: int, data: Path) -> list[float]:
    """Each step's loss of the one-process reference (train/reference.py) of the tiny model's job
    on ``mesh`` (``steps`` steps, the text file ``data``), trained in this process on one intra-op
    thread, as a rank runs. Skips without torch on the host, fails under CI=true."""
    torch = need_torch()
    from simcluster.core.config import Config
    from simcluster.train.preflight import preflight
    from simcluster.train.reference import run_reference

    torch.set_num_threads(1)
    return [r["loss"] for r in run_reference(preflight(Config(mesh=mesh, model="tiny", steps=steps, data=str(data))))]
