"""The one JobRequest constructor (launcher/job/request.py) refuses bad input without Docker: each
kind of bad value raises ConfigError naming the field, and nothing is written; the CLI's paths exit 2.

    python -m pytest -q -n 0 tests/test_request.py
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import simcluster
from simcluster.launcher import cli
from simcluster.launcher.job.request import make_request
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DDP = str(ROOT / "examples" / "ddp.py")
CODE = dict(script=DDP, nodes=2, nproc_per_node=1)

BAD = [  # (keywords, the field the message names)
    (dict(model="tiny", steps=True), "steps"),  # a bool is no int
    (dict(model="tiny", steps=3.0), "steps"),  # an int field refuses a float
    (dict(model="tiny", steps="3"), "steps"),  # ... and text
    (dict(**CODE, max_restarts=-1), "max_restarts"),  # out of range
    (dict(model="tiny", steps=10**12), "steps"),  # no sane run has so many steps
    (dict(script=DDP, nodes=2.0, nproc_per_node=1), "nodes"),  # a float node count
    (dict(script=DDP, nodes=100000, nproc_per_node=1), "nodes"),
    (dict(**CODE, cpus_per_node=float("nan")), "cpus_per_node"),  # not finite
    (dict(model="tiny", timeout_s=10**400), "timeout_s"),  # an int that overflows a float
    (dict(model="tiny", lr=float("inf")), "lr"),
    (dict(**CODE, mount={"/tmp": "/data"}), "mount"),  # a dict where a list is expected is not flattened
    (dict(**CODE, mount="/tmp:/data"), "mount"),  # a string is no list either
    (dict(**CODE, total_steps=5, trace_steps="1-1000000000"), "trace_steps"),  # refused before any list
    (dict(model="tiny", steps=3, trace_steps="1-1000000000"), "trace_steps"),
    (dict(model="tiny", steps=3, profile_step=9), "profile_step"),
    (dict(model="tiny", steps=6, trace_steps="3,2-4"), "trace_steps: step 3 given twice in '3,2-4'"),
    (dict(**CODE, total_steps=6, trace_steps="3,3"), "trace_steps: step 3 given twice in '3,3'"),
    (dict(script="no/such/train.py", nodes=1, nproc_per_node=1), "script"),  # existence
    (dict(code="no/such/folder", module="m", nodes=1, nproc_per_node=1), "code"),
    (dict(model="tiny", config="no/such/run.yaml"), "config"),
    (dict(script=DDP, module="mypkg.train", nodes=1, nproc_per_node=1), "module"),  # no effect with script
    (dict(script=DDP, nodes=2), "nproc_per_node"),  # one without the other
    (dict(model="tiny", total_steps=5), "total-steps"),  # no effect on the built-in trainer
    (dict(**CODE, strict_memory=True, memory_per_node="3g"), "strict-memory"),  # no effect on your code
    (dict(model="tiny", strict_memory=True), "strict-memory"),  # nothing to check against
    (dict(**CODE, lr=0.1), "--lr"),  # a trainer option has no effect on your code
    (dict(**CODE, rdzv_backend="etcd"), "rdzv_backend"),  # a choice
    (dict(**CODE, wall_timeout_s=float("inf")), "wall_timeout_s"),
    (dict(**CODE, start_late=["node-1"]), "start_late"),
    (dict(**CODE, workdir="/a\nb"), "--workdir"),  # a control character
    (dict(**CODE, stepz=3), "stepz"),  # an unknown keyword
    (dict(**CODE, out="x.yml"), "out"),  # generate's option is no `up` option
]


@pytest.mark.parametrize("kwargs, field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_input_names_the_field_and_writes_nothing(tmp_path, kwargs, field):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        make_request("up", run_dir=str(run_dir), **kwargs)
    assert field in str(e.value)
    with pytest.raises(ConfigError) as e:
        simcluster.run(run_dir=str(run_dir), **kwargs)
    assert field in str(e.value)
    assert not run_dir.exists()


def test_a_script_the_containers_user_cannot_read(tmp_path):
    """Mode 0600, owned by whoever runs the test; the containers run as another uid (4242 here, never the
    owner), so they cannot read it."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    script.chmod(0o600)
    tmp_path.chmod(0o755)
    with pytest.raises(ConfigError, match=r"script: .*train.py is not readable by the containers' user 4242:4242"):
        make_request("up", script=str(script), nodes=1, nproc_per_node=1, user="4242:4242")


def test_a_chaos_fault_after_the_last_step_or_on_a_missing_node(tmp_path):
    with pytest.raises(ConfigError, match=r"chaos: Kill\('node-1', at_step=9\): at_step 9 is after the run's last step 3"):
        simcluster.run(model="tiny", mesh="2x1x1", steps=3, chaos=simcluster.Kill("node-1", at_step=9),
                       run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="no node 'node-5'"):
        simcluster.run(model="tiny", mesh="2x1x1", steps=3, chaos=simcluster.Kill("node-5", at_step=2),
                       run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_compare_refuses_a_float_node_count_and_unknown_keywords(tmp_path):
    base = tmp_path / "base"
    with pytest.raises(ConfigError, match="--against-nodes: nodes: must be >= 1 and <= 64 \\(an int\\), got 2.0"):
        simcluster.compare(script=DDP, mesh="2x1x1", against_nodes=2.0, against_nproc_per_node=1, run_dir=str(base))
    with pytest.raises(ConfigError, match="nodes: must be .*got 2.0"):
        simcluster.compare(script=DDP, nodes=2.0, nproc_per_node=1, against="2x1x1", run_dir=str(base))
    with pytest.raises(ConfigError, match="unknown keyword argument 'rtoll'.*did you mean rtol"):
        simcluster.compare(script=DDP, mesh="2x1x1", against="1x1x1", rtoll=0.1, run_dir=str(base))
    with pytest.raises(ConfigError, match="--rtol: must be a finite number"):
        simcluster.compare(script=DDP, mesh="2x1x1", against="1x1x1", rtol=True, run_dir=str(base))
    assert not base.exists()


def test_the_request_is_frozen_and_typed():
    req = make_request("up", model="tiny", steps=3, timeout_s=30, mount=["/tmp:/data"])
    assert (req.steps, req.timeout_s, req.mount, req.builtin) == (3, 30.0, ("/tmp:/data",), True)
    assert req.given() == {"model": "tiny", "steps": 3, "timeout_s": 30.0, "mount": ("/tmp:/data",)}
    with pytest.raises(Exception):
        req.steps = 4


@pytest.mark.parametrize("argv, message", [
    (["up", "--model", "tiny", "--steps", "x"], "steps: must be >= 1"),
    (["up", "--script", DDP, "--nodes", "2.0", "--nproc-per-node", "1"], "nodes: must be >= 1"),
    (["generate", "--mesh", "2x1x1", "--model", "tiny", "--trace-steps", "1-1000000000", "--stdout"], "trace_steps: "),
    (["generate", "--mesh", "2x1x1", "--cpus-per-node", "inf", "--stdout"], "cpus_per_node: "),
    (["compare", "--script", DDP, "--mesh", "2x1x1", "--against-nodes", "1", "--against-nproc-per-node", "1",
      "--nodes", "x"], "nodes: must be"),
])
def test_each_cli_path_exits_2(tmp_path, capsys, argv, message):
    argv = [*argv, "--run-dir", str(tmp_path / "run")] if "--stdout" not in argv else argv
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not (tmp_path / "run").exists()


def test_requirements_and_wheels_are_checked_at_the_edge(tmp_path):
    """--requirements and --wheel: a missing or unreadable file, a file that is no wheel, a list given
    as text: ConfigError naming the field, before any download or build."""
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(ConfigError, match=r"requirements: '.*nope.txt' is not a readable file; e.g. --requirements"):
        make_request("up", script=str(script), nodes=1, nproc_per_node=1, requirements=str(tmp_path / "nope.txt"))
    (tmp_path / "notes.txt").write_text("x\n")
    with pytest.raises(ConfigError, match=r"wheel: '.*notes.txt' is not a readable wheel file .* --wheel dist/"):
        make_request("up", script=str(script), nodes=1, nproc_per_node=1, wheel=[str(tmp_path / "notes.txt")])
    with pytest.raises(ConfigError, match="wheel"):
        make_request("up", script=str(script), nodes=1, nproc_per_node=1, wheel=str(tmp_path / "notes.txt"))
    (tmp_path / "requirements.txt").write_text("tqdm\n")
    req = make_request("up", script=str(script), nodes=1, nproc_per_node=1, requirements=str(tmp_path / "requirements.txt"))
    assert req.requirements == str(tmp_path / "requirements.txt") and req.wheel == ()
    assert not list(tmp_path.glob("runs"))


def test_importing_the_request_loads_no_engine_and_no_docker_sdk():
    """The request is a pure core: --target is text there (the engines are looked up at the door), so a
    fresh interpreter importing it loads these modules of the project and none of an engine or Docker."""
    code = ("import sys, simcluster.launcher.job.request; print(' '.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('simcluster', 'docker'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [  # nothing of train/ (the torch side): the trainer's facts are the floor's
        "simcluster", "simcluster.core", "simcluster.core.config", "simcluster.core.errors",
        "simcluster.core.flightrec",  # the Flight Recorder's variable names: --env's checks
        "simcluster.core.hardware", "simcluster.core.layout",
        "simcluster.core.paths",  # a link that leads nowhere: the checks of --out and --run-dir
        "simcluster.core.units",  # hardware: --gpu's names
        "simcluster.launcher", "simcluster.launcher.container", "simcluster.launcher.container.layout",
        "simcluster.launcher.job", "simcluster.launcher.job.checks", "simcluster.launcher.job.deps", "simcluster.launcher.job.env",
        "simcluster.launcher.job.fields", "simcluster.launcher.job.request", "simcluster.launcher.job.sections"]


def test_a_target_no_engine_has_is_refused_at_the_door(tmp_path):
    """The request keeps --target as text; run() looks the engine up before anything is resolved or written."""
    req = make_request("up", model="tiny", mesh="1x1x1", target="kubernetes", run_dir=str(tmp_path / "run"))
    assert req.target == "kubernetes"
    with pytest.raises(ConfigError, match=r"target: must be one of compose, swarm, slurm, jobset, trainjob, skypilot, got "
                                          r"'kubernetes'; e.g. target='compose' \(--target compose\)"):
        simcluster.run(model="tiny", mesh="1x1x1", target="kubernetes", run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit) as e:  # the command line's door: argparse's choices, the same table
        cli.main(["generate", "--mesh", "1x1x1", "--target", "kubernetes", "--stdout"])
    assert e.value.code == 2


def test_exit_grace_s_one_field_every_door(tmp_path):
    """--exit-grace-s is declared once (job/sections.py UpOptions): the request types and bounds it, the
    command line has the flag, an engine that cannot honour it refuses it, generate does not take it."""
    script = str(ROOT / "examples" / "ddp.py")
    req = make_request("up", script=script, nodes=1, nproc_per_node=1, exit_grace_s=30)
    assert req.exit_grace_s == 30.0 and make_request("up", model="tiny").exit_grace_s == 10.0
    with pytest.raises(ConfigError, match=r"exit_grace_s: must be > 0 and <= 3600 \(a finite number\), got 0.0; "
                                          r"e.g. exit_grace_s=30.0 \(--exit-grace-s 30.0\)"):
        make_request("up", model="tiny", exit_grace_s=0)
    with pytest.raises(ConfigError, match="unknown keyword argument 'exit_grace_s'"):
        make_request("generate", model="tiny", exit_grace_s=30)
    with pytest.raises(ConfigError, match=r"--exit-grace-s: Slurm ends a job's steps itself"):
        simcluster.run(model="tiny", mesh="1x1x1", target="slurm", exit_grace_s=30, run_dir=str(tmp_path / "r"))
    assert cli.main(["up", "--model", "tiny", "--exit-grace-s", "x", "--run-dir", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


def test_every_fields_example_is_a_value_it_accepts():
    """The example an error suggests (``e.g. name=value (--flag value)``) is one the field itself takes:
    given (not None) and accepted by its own check (``--stall-s nan`` once suggested ``--stall-s None``)."""
    from simcluster.launcher.job.fields import FIELDS, check_value

    assert [n for n, spec in FIELDS.items() if spec.example is None] == []
    for name, spec in FIELDS.items():
        value = [spec.example] if spec.kind == "strs" else spec.example  # as example() writes a list field
        check_value(name, value)  # raises ConfigError naming the field if not
