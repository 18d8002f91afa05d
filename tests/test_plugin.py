"""The pytest plugin (launcher/testing/plugin.py) as a user's pytest session meets it: each case
writes a small test file and runs pytest on it in a subprocess, with the plugin loaded by -p
(here, from the checkout; installed, its pytest11 entry point loads it: tests/test_ci_templates.py).

    python -m pytest -q tests/test_plugin.py

A failed test's report shows its run's summary with the failing rank's error; the marks give
defaults; without Docker the tests skip, or fail under CI=true, as the option says; Ctrl-C, or an
exception raised in the middle of a run, leaves no container or network behind; wall_timeout_s
ends a run that hangs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from simcluster.launcher.docker.handle import Handle

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "simcluster.launcher.testing.plugin"
# torch-free jobs: a cluster of them starts in seconds
BOOM = "import os\nprint('rank', os.environ['RANK'], flush=True)\nif os.environ['RANK'] == '1':\n" \
       "    raise ValueError('boom on rank 1')\n"
TICKS = "import time\nfor n in range(100000):\n    print('tick', n, flush=True)\n    time.sleep(1)\n"
docker_test = pytest.mark.docker


def write(folder: Path, name: str, text: str) -> Path:
    folder.chmod(0o755)  # the code folder is mounted: readable by the containers' user (pytest makes it 0700)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def pytest_cmd(folder: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "--basetemp",
            str(folder / "basetemp"), *args]


def inner_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def leftovers(basetemp: Path) -> dict[str, list]:
    """project -> its containers and networks still there, for every run folder under basetemp."""
    from simcluster.launcher.docker.client import PROJECT_LABEL, Client
    from simcluster.launcher.docker.cluster import labelled

    out = {}
    for compose_file in basetemp.rglob("compose.yml"):
        project = Handle.for_run(str(compose_file.parent)).project
        containers, networks = labelled(Client(), f"{PROJECT_LABEL}={project}")
        out[project] = [c.name for c in containers] + [n.name for n in networks]
    return out


@docker_test
def test_a_failed_test_reports_the_runs_summary_and_the_ranks_error(tmp_path, trainer_image):
    write(tmp_path, "boom.py", BOOM)
    write(tmp_path, "test_user.py", """
        import pytest

        pytestmark = pytest.mark.simcluster(nodes=2, nproc_per_node=1, wall_timeout_s=300)


        @pytest.mark.simcluster(mount_code=True, wall_timeout_s=120)
        def test_marks_give_defaults_the_closest_winning(simcluster):
            assert simcluster.defaults == {"nodes": 2, "nproc_per_node": 1, "mount_code": True, "wall_timeout_s": 120}


        @pytest.mark.simcluster(mount_code=True)
        def test_boom(simcluster):
            run = simcluster(script="boom.py")
            assert [(f.rank, f.node, f.error) for f in run.failed] == [(1, "node-1", "ValueError: boom on rank 1")]
            assert run.ok
    """)
    proc = subprocess.run(pytest_cmd(tmp_path, "-q", "test_user.py"), cwd=tmp_path, env=inner_env(),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1 and "1 failed, 1 passed" in out, out + proc.stderr
    section = out[out.index("- simcluster run 1: "):]
    assert "== summary: FAILED ==" in section, out
    assert "FAILED rank 1 on node-1: ValueError: boom on rank 1" in section, out
    assert 'raise ValueError(\'boom on rank 1\')' in section, out  # the failing frame's source line
    assert leftovers(tmp_path / "basetemp") and not any(leftovers(tmp_path / "basetemp").values())


@pytest.mark.parametrize("ci, option, ini, outcome", [
    (None, None, None, "1 skipped"),
    ("true", None, None, "1 error"),
    ("true", "skip", None, "1 skipped"),
    (None, None, "fail", "1 error"),
])
def test_without_docker_skip_or_fail_as_ci_and_the_option_say(tmp_path, ci, option, ini, outcome):
    write(tmp_path, "test_user.py", """
        def test_needs_a_cluster(simcluster):
            simcluster(script="train.py", nodes=1, nproc_per_node=1)
    """)
    if ini:
        write(tmp_path, "pytest.ini", f"[pytest]\nsimcluster_docker = {ini}\n")
    env = inner_env(DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock", **({"CI": ci} if ci else {}))
    args = ["-q", "-rsE", "test_user.py", *(["--simcluster-docker", option] if option else [])]
    proc = subprocess.run(pytest_cmd(tmp_path, *args), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert outcome in proc.stdout and "no Docker engine answers" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == (0 if "skipped" in outcome else 1)


@docker_test
def test_ctrl_c_in_the_middle_of_a_run_leaves_no_cluster(tmp_path, trainer_image):
    write(tmp_path, "ticks.py", TICKS)
    write(tmp_path, "test_user.py", """
        def test_long(simcluster):
            simcluster(script="ticks.py", nodes=2, nproc_per_node=1, mount_code=True)
    """)
    proc = subprocess.Popen(pytest_cmd(tmp_path, "-q", "test_user.py"), cwd=tmp_path, env=inner_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = tmp_path / "basetemp" / "test_long0" / "run-1" / "cluster.log"
        t0 = time.monotonic()
        while not (log.is_file() and "tick 2" in log.read_text()) and time.monotonic() - t0 < 300:
            time.sleep(0.5)
        assert log.is_file() and "tick 2" in log.read_text(), proc.poll()
        assert any(leftovers(tmp_path / "basetemp").values())  # the cluster runs: what Ctrl-C must remove
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 2 and "KeyboardInterrupt" in out, out
    assert not any(leftovers(tmp_path / "basetemp").values()), out


@docker_test
def test_an_exception_raised_during_a_run_and_a_wall_timeout_leave_no_cluster(tmp_path, trainer_image):
    write(tmp_path, "ticks.py", TICKS)
    write(tmp_path, "test_user.py", """
        import signal


        def test_raised_mid_run(simcluster, tmp_path):
            def alarm(*_):  # as pytest-timeout's signal method does
                raise RuntimeError("the test's own timeout")
            signal.signal(signal.SIGALRM, alarm)
            signal.alarm(12)  # the cluster is starting or running by then, whatever the load
            simcluster(script="ticks.py", nodes=2, nproc_per_node=1, mount_code=True)


        def test_wall_timeout(simcluster):
            run = simcluster(script="ticks.py", nodes=1, nproc_per_node=1, mount_code=True, wall_timeout_s=10)
            assert (run.ok, run.exit_code, run.timed_out) == (False, 1, True)
            assert "TIMED OUT    after 10s (--wall-timeout-s)" in run.summary
            assert 10 <= run.record["wall_s"] < 50, run.record  # killed at its limit, not at the job's end
    """)
    proc = subprocess.run(pytest_cmd(tmp_path, "-q", "test_user.py"), cwd=tmp_path, env=inner_env(),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert "1 failed, 1 passed" in out and "RuntimeError: the test's own timeout" in out, out + proc.stderr
    found = leftovers(tmp_path / "basetemp")
    assert len(found) == 2 and not any(found.values()), found
