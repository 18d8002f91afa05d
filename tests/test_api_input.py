"""simcluster.run without Docker: bad input raises ConfigError with the CLI's exit-2 message before
anything starts or is written; keywords map onto `launcher up`'s flags; faults are checked.

    python -m pytest -q tests/test_api_input.py
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import simcluster
from simcluster.launcher.job.request import make_request

ROOT = Path(__file__).resolve().parent.parent
DDP = str(ROOT / "examples" / "ddp.py")


def cli_error(*argv: str) -> str:
    """What `launcher up ARGV` says on stderr after ``error: `` (it must exit 2)."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc
    return proc.stderr.split("error: ", 1)[1].strip()


@pytest.mark.parametrize("kwargs, argv", [
    (dict(script=DDP, mesh="2x2x2", nodes=2, nproc_per_node=1), ["--script", DDP, "--mesh", "2x2x2", "--nodes", "2",
                                                                 "--nproc-per-node", "1"]),
    (dict(script="no/such/train.py", nodes=1, nproc_per_node=1), ["--script", "no/such/train.py", "--nodes", "1",
                                                                  "--nproc-per-node", "1"]),
    (dict(mesh="2x2"), ["--mesh", "2x2"]),
    (dict(model="tiny", steps="x"), ["--model", "tiny", "--steps", "x"]),
    (dict(script=DDP, nodes=1, nproc_per_node=1, max_restarts=-1), ["--script", DDP, "--nodes", "1",
                                                                   "--nproc-per-node", "1", "--max-restarts", "-1"]),
])
def test_bad_input_raises_the_clis_message_and_writes_nothing(tmp_path, kwargs, argv):
    run_dir = tmp_path / "run"
    with pytest.raises(simcluster.ConfigError) as e:
        simcluster.run(run_dir=str(run_dir), **kwargs)
    assert str(e.value) == cli_error(*argv, "--run-dir", str(run_dir))
    assert not run_dir.exists()


def test_an_unknown_keyword_names_the_flag_it_would_be_and_the_close_ones(tmp_path):
    with pytest.raises(simcluster.ConfigError, match=r"unknown keyword argument 'stepz' \(on the command line: "
                       r"unrecognized arguments: --stepz\); did you mean steps"):
        simcluster.run(model="tiny", stepz=3, run_dir=str(tmp_path / "run"))
    assert "unrecognized arguments: --stepz" in subprocess.run(
        [sys.executable, "-m", "launcher", "up", "--stepz", "3"], cwd=ROOT, capture_output=True, text=True).stderr
    with pytest.raises(simcluster.ConfigError, match="mount_code: a switch"):
        simcluster.run(script=DDP, nodes=1, nproc_per_node=1, mount_code="yes")
    with pytest.raises(simcluster.ConfigError, match="args: a list of your code's arguments"):
        simcluster.run(script=DDP, nodes=1, nproc_per_node=1, args="--steps 3")


def test_keywords_become_the_typed_request_of_up():
    req = make_request("up", script=DDP, nodes=2, nproc_per_node=1, args=["--steps", 3], mount_code=True, keep=False,
                       mount=["/tmp:/data/x", "/etc:/data/y:ro"], start_late={"node-1": 5}, traffic=1,
                       trace_steps="2,3", wall_timeout_s=30, cpus_per_node=1.5)
    assert (req.script, req.nodes, req.nproc_per_node, req.args) == (DDP, 2, 1, ("--steps", "3"))
    assert (req.mount_code, req.keep, req.traffic, req.trace_steps) == (True, False, 1, "2,3")
    assert req.mount == ("/tmp:/data/x", "/etc:/data/y:ro") and req.start_late == (("node-1", 5.0),)
    assert (req.wall_timeout_s, req.cpus_per_node, req.quiet) == (30.0, 1.5, False)
    with pytest.raises(simcluster.ConfigError, match="mesh: cannot parse '-1x2x2'"):
        simcluster.run(mesh="-1x2x2")  # a value starting with '-' is refused as a mesh, not taken for a flag


@pytest.mark.parametrize("chaos, message", [
    (simcluster.Kill("node-7", at_step=3), "chaos: Kill('node-7', at_step=3): no node 'node-7' in this launch; "
                                           "its nodes are node-0, node-1"),
    (simcluster.Pause("node-1", at_step=0), "chaos: Pause('node-1', at_step=0): at_step must be an int from 1 to "
                                            "10000000"),
    (simcluster.Kill("node-1", at_step=10**12), "chaos: Kill('node-1', at_step=1000000000000): at_step must be an int "
                                                "from 1 to 10000000 (a bool is no step), got 1000000000000"),
    (simcluster.Freeze(rank=2, at_step=1), r"chaos: Freeze\(rank=2, at_step=1\): rank 2 is not a rank of this "
                                           r"launch \(0..1\)"),
    ("kill node-1", "chaos: expected a fault or a list of them"),
])
def test_faults_are_checked_against_the_launch_before_anything_starts(tmp_path, chaos, message):
    with pytest.raises(simcluster.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       if "\\" not in message else message):
        simcluster.run(script=DDP, nodes=2, nproc_per_node=1, chaos=chaos, run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_wall_timeout_must_be_positive_and_slurm_refuses_it(tmp_path):
    with pytest.raises(simcluster.ConfigError, match=r"wall_timeout_s: must be > 0 and <= 1e\+06 s \(a finite number\), got 0.0"):
        simcluster.run(script=DDP, nodes=1, nproc_per_node=1, wall_timeout_s=0, run_dir=str(tmp_path / "r"))
    with pytest.raises(simcluster.ConfigError, match="--wall-timeout-s: a Slurm job's wall-clock limit is its own"):
        simcluster.run(model="tiny", mesh="1x1x1", target="slurm", wall_timeout_s=60, run_dir=str(tmp_path / "r"))
