"""Every launcher option is checked before a document is written, the way Docker and Compose would
check it: exit 2, the message naming the field and a fix, nothing written. Also what `chaos` and
`status` say about a run where nothing runs. No Docker (the engine is faked), no torch.

    python -m pytest -q tests/test_launcher_input.py
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import simcluster.launcher.cli as cli
from simcluster.launcher.job.checks import MIN_MEMORY, image_problem, memory_bytes, memory_problem

ROOT = Path(__file__).resolve().parent.parent
DDP = str(ROOT / "examples" / "ddp.py")
USER_CODE = ["--nodes", "1", "--nproc-per-node", "1", "--script", DDP]


def main(capsys, *argv: str) -> tuple[int, str, str]:
    """``python -m launcher ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(capsys, tmp_path: Path, args: list[str], field: str, command: str = "generate") -> str:
    """Run ARGS (generate: --out under tmp_path); assert exit 2, field named, no traceback, nothing written."""
    before = sorted(tmp_path.rglob("*"))
    extra = ["--out", str(tmp_path / "out.yml")] if command == "generate" and "--out" not in args else []
    code, _, err = main(capsys, command, *args, *extra)
    assert code == 2, (args, err)
    assert err.startswith("error: ") and field in err and "Traceback" not in err, (args, err)
    assert sorted(tmp_path.rglob("*")) == before, f"{args}: something was written"
    return err


CONTROL = [
    (["--mesh", "1x1x1", "--run-dir", "runs/a\nb"], "--run-dir: 'runs/a\\nb' holds the control character '\\n'"),
    (["--mesh", "1x1x1", "--run-dir", "runs/a\tb"], "--run-dir: 'runs/a\\tb'"),
    (["--mesh", "1x1x1", "--data", "corpus\r.txt"], "--data: "),
    (["--nodes", "1", "--nproc-per-node", "1", "--script", "a\x1b.py"], "--script: "),
    (["--nodes", "1", "--nproc-per-node", "1", "--code", "dir\x7f", "--module", "m"], "--code: 'dir\\x7f'"),
    ([*USER_CODE, "--mount", "/tmp:/data/x\n"], "--mount: "),
    (["--nodes", "1", "--nproc-per-node", "1", "--module", "a\nb"], "--module: "),
    (["--mesh", "1x1x1", "--image", "simcluster/trainer\u2028"], "--image: "),
    (["--mesh", "1x1x1", "--target", "swarm", "--workdir", "/shared/a\x85b"], "--workdir: "),
    (["--mesh", "1x1x1", "--target", "slurm", "--setup", "module load x\nrm -rf /"], "--setup: "),
    (["--mesh", "1x1x1", "--user", "1000:1000\n"], "--user: "),
    (["--mesh", "1x1x1", "--resume", "runs/x\n"], "--resume: "),
    ([*USER_CODE, "--", "--note", "two\nlines"], "argument 2 after --: 'two\\nlines'"),
]


@pytest.mark.parametrize("args,message", CONTROL, ids=[m.split(":")[0] for _, m in CONTROL])
def test_control_characters_are_refused(capsys, tmp_path, args, message):
    err = refused(capsys, tmp_path, args, message)
    assert "e.g. " in err  # a valid example


def test_control_characters_in_out_config_and_up(capsys, tmp_path, monkeypatch):
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--out", str(tmp_path / "a\nb.yml")], "--out: ")
    config = tmp_path / "run.yaml"
    config.write_text('data: "corpus\\n.txt"\nmodel: tiny\n')
    err = refused(capsys, tmp_path, ["--config", str(config)], f"data (in --config {config}): 'corpus\\n.txt'")
    assert f"remove it from {config}" in err
    run = tmp_path / "run\nx"
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--model", "tiny", "--run-dir", str(run)], "--run-dir: ", "up")
    weird = tmp_path / "cwd\tx"  # relative paths take the current folder's control character
    weird.mkdir()
    monkeypatch.chdir(weird)
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--run-dir", "runs/a", "--out", "/dev/null/x"],
            "run_dir: " + repr(str(weird / "runs" / "a")))


def test_memory_sizes():
    for ok, size in [("6m", MIN_MEMORY), ("6291456", MIN_MEMORY), ("6291456b", MIN_MEMORY), ("0.5g", 2**29),
                     ("3G", 3 * 2**30), ("1536m", 1536 * 2**20), ("7168k", 7168 * 1024)]:
        assert memory_bytes(ok) == size and memory_problem(ok) is None, ok
    for bad in ["lots", "", "0", "-1g", "3gb", "1e9", "1.5", "1.5b", "3 g", "03g", "g"]:
        assert memory_bytes(bad) is None and "is not a size" in memory_problem(bad), bad
    for small in ["5m", "6291455", "1k", "0g", "0.005g"]:
        assert "below Docker's minimum memory limit of 6 MiB" in memory_problem(small), small


@pytest.mark.parametrize("value,message", [
    ("5m", "memory_per_node: '5m' is 5242880 bytes, below Docker's minimum memory limit of 6 MiB"),
    ("lots", "memory_per_node: 'lots' is not a size"), ("1.5", "memory_per_node: '1.5' is not a size")])
def test_memory_per_node_refused(capsys, tmp_path, value, message):
    assert "e.g. --memory-per-node" in refused(capsys, tmp_path, ["--mesh", "1x1x1", "--memory-per-node", value],
                                               message)


def test_memory_per_node_half_a_gigabyte_is_a_size(capsys, tmp_path):
    code, _, err = main(capsys, "generate", "--mesh", "1x1x1", "--memory-per-node", "0.5g", "--out",
                        str(tmp_path / "c.yml"))
    assert code == 0, err
    assert "mem_limit: 0.5g" in (tmp_path / "c.yml").read_text()


@pytest.mark.parametrize("cpus", ["0", "-1", "0.001", "nan", "inf"])
def test_cpus_below_docker_minimum(capsys, tmp_path, cpus):
    refused(capsys, tmp_path, ["--mesh", "1x1x1", f"--cpus-per-node={cpus}"], "cpus_per_node: must be >= 0.01 CPUs")


def test_up_with_more_cpus_than_this_machine(capsys, tmp_path):
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--model", "tiny", "--cpus-per-node", "100000", "--run-dir",
                               str(tmp_path / "run")], "--cpus-per-node 100000: this machine has", "up")


VALID_IMAGES = ["simcluster/trainer:latest", "trainer", "localhost:5000/a/b:1", "docker.io/library/ubuntu:24.04",
                "registry.example.com/me/trainer@sha256:" + "a" * 64, "[::1]:5000/x:y", "Registry.Example.com/x",
                "a__b/c-d---e.f:T_1.0-x", "ghcr.io/me/trainer:1@sha256:" + "0" * 64, "x:" + "t" * 128]
BAD_IMAGES = [
    ("", "it is empty"), ("Simcluster/Trainer", "has uppercase letters; repository names are lowercase"),
    ("simcluster/trainer:bad tag", "holds whitespace"), ("/simcluster/trainer", "starts with '/'"),
    ("simcluster/trainer::latest", "it has '::'"), ("simcluster/trainer:", "tag ''"),
    ("simcluster/trainer:-x", "tag '-x'"), ("x:" + "t" * 129, "tag 'ttt"), ("a//b", "repository name 'a//b'"),
    ("a/b/", "repository name 'a/b/'"), ("trainer@sha256:abc", "digest 'sha256:abc'"),
    ("trainer@sha256:" + "a" * 63, "digest"), ("tr$iner", "repository name 'tr$iner'"), (":latest", "no repository"),
    ("bad_host.example.com/x", "registry host 'bad_host.example.com'"), ("-x", "repository name '-x'"),
    ("a" * 256, "longer than 255"),
]


def test_image_references():
    for image in VALID_IMAGES:
        assert image_problem(image) is None, image
    for image, why in BAD_IMAGES:
        assert why in (image_problem(image) or ""), (image, image_problem(image))


@pytest.mark.parametrize("image,why", BAD_IMAGES[:6])
def test_bad_image_exits_2(capsys, tmp_path, image, why):
    err = refused(capsys, tmp_path, ["--mesh", "1x1x1", f"--image={image}"], f"image: {image!r} is not an image "
                                                                               f"reference: ")
    assert why in err and "e.g. --image simcluster/trainer:latest" in err


@pytest.mark.parametrize("command", ["generate", "up"])
def test_run_folder_that_is_a_file(capsys, tmp_path, command):
    (tmp_path / "taken").write_text("not a folder\n")
    err = refused(capsys, tmp_path, ["--mesh", "1x1x1", "--model", "tiny", "--run-dir", str(tmp_path / "taken")],
                  f"run_dir: {tmp_path / 'taken'} exists and is not a folder", command)
    assert "e.g. --run-dir runs/mesh-2x2x2" in err
    refused(capsys, tmp_path, [*USER_CODE, "--run-dir", str(tmp_path / "taken" / "run")],
            f"run_dir: {tmp_path / 'taken'}, a parent of", command)
    assert (tmp_path / "taken").read_text() == "not a folder\n"


def test_out_that_is_a_folder(capsys, tmp_path):
    (tmp_path / "folder").mkdir()
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--out", str(tmp_path / "folder")], "out: ")


def test_colon_in_a_bind_mount_path(capsys, tmp_path):
    err = refused(capsys, tmp_path, ["--mesh", "1x1x1", "--run-dir", "runs/a:b"], "--run-dir: 'runs/a:b' has a ':'")
    assert "SRC:DST:MODE" in err
    code, out, err = main(capsys, "generate", "--mesh", "1x1x1", "--run-dir", "runs/a:b", "--target", "slurm",
                          "--stdout")
    assert code == 0 and "mkdir -p runs/a:b" in out, err  # no bind mount on slurm


def test_engine_option_names(capsys, tmp_path):
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--runs-claim", "My_Claim"], "runs_claim: 'My_Claim' is not a "
                                                                               "Kubernetes object name")
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--target", "slurm", "--container-image", "a b"],
            "container_image: 'a b' is empty or holds whitespace")
    refused(capsys, tmp_path, ["--mesh", "1x1x1", "--target", "slurm", "--workdir", "/shared/my checkout"],
            "workdir: '/shared/my checkout' is empty or holds whitespace")


def test_slurm_quotes_workdir_and_container_image(capsys):
    code, out, err = main(capsys, "generate", "--mesh", "1x1x1", "--target", "slurm", "--workdir", "/sh$red",
                          "--container-image", "nvcr.io#nvidia/pytorch:24.05-py3", "--stdout")
    assert code == 0, err
    assert "SIMCLUSTER_WORKDIR=${SIMCLUSTER_WORKDIR:-'/sh$red'}" in out
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'" in out


class FakeContainer:
    """What chaos and status read of a container: status, labels, attrs, short_id."""

    def __init__(self, service: str, status: str, code: int = 0, rank: int | None = None):
        self.status, self.short_id = status, service[:12]
        self.labels = {"com.docker.compose.service": service}
        if rank is not None:
            self.labels.update({"io.simcluster.node-rank": str(rank), "io.simcluster.ranks": str(rank)})
        self.attrs = {"State": {"ExitCode": code, "StartedAt": "2025-01-01T12:00:00.000000000Z",
                                "FinishedAt": "2025-01-01T12:05:00.000000000Z"}}


def _run_folder(tmp_path: Path, capsys) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    code, _, err = main(capsys, "generate", "--mesh", "2x1x1", "--out", str(run / "compose.yml"))
    assert code == 0, err
    return run


def test_chaos_on_a_run_where_nothing_runs_says_so_and_exits_1(capsys, tmp_path, monkeypatch):
    """A run folder of `up` (job.json first) where no container runs yet: chaos waits for them, then says so."""
    from simcluster.launcher.docker.client import Client
    from simcluster.launcher.drills import chaos

    run = _run_folder(tmp_path, capsys)
    (run / "job.json").write_text(json.dumps({"nodes": {"node-0": "0", "node-1": "1"}, "nproc_per_node": 1,
                                              "world_size": 2, "image": "x"}))
    monkeypatch.setattr(Client, "containers", lambda self, project, stack=False: {})
    monkeypatch.setattr(chaos, "START_WAIT_S", 0.3)
    code, out, err = main(capsys, "chaos", "--kill", "node-1", "--at-step", "5", "--run-dir", str(run))
    assert code == 1, out + err
    assert f"chaos: waiting for step 5 of run folder {run} to kill node-1; giving up at " in out
    assert "(--wait-s 3600)" in out and "no container of project" in out  # what it waits for, at once
    assert "appeared within 0.3 s: nothing runs in" in err and "`python -m launcher up --run-dir" in err
    assert "Traceback" not in err


def test_chaos_on_a_folder_made_by_generate_refuses_at_once(capsys, tmp_path, monkeypatch):
    """compose.yml, no job.json, no container: never a run of `up`, so nothing to wait for (node-9 or any)."""
    from simcluster.launcher.docker.client import Client

    run = _run_folder(tmp_path, capsys)
    monkeypatch.setattr(Client, "containers", lambda self, project, stack=False: {})
    code, out, err = main(capsys, "chaos", "--kill", "node-9", "--at-step", "5", "--run-dir", str(run))
    assert code == 2 and "no job.json and no container of it runs" in err and "generate" in err, out + err


def test_chaos_on_a_file_of_generate_refuses_at_once(capsys, tmp_path):
    """A folder holding generate's file under another name, and --file with a node the file lacks: exit 2
    before any wait (no container is asked for: nothing could run there)."""
    gen = tmp_path / "gen"
    gen.mkdir()
    code, _, err = main(capsys, "generate", "--mesh", "2x1x1", "--out", str(gen / "mesh.yml"))
    assert code == 0, err
    code, out, err = main(capsys, "chaos", "--kill", "node-9", "--at-step", "1", "--run-dir", str(gen))
    assert code == 2 and f"--run-dir {gen}: holds mesh.yml but no job.json or compose.yml" in err, out + err
    assert f"pass --file {gen / 'mesh.yml'}" in err and "waiting" not in out
    code, out, err = main(capsys, "chaos", "--kill", "node-9", "--at-step", "1", "--file", str(gen / "mesh.yml"))
    assert code == 2 and f"kill: --kill node-9: {gen / 'mesh.yml'} has no such service; its nodes: node-0, node-1; " \
        "e.g. --kill node-1" in err, out + err


def test_chaos_on_an_ended_run_exits_1_at_once(capsys, tmp_path, monkeypatch):
    from simcluster.launcher.docker.client import Client

    run = _run_folder(tmp_path, capsys)
    found = {"rendezvous": FakeContainer("rendezvous", "exited", 1), "node-0": FakeContainer("node-0", "exited", 0, 0),
             "node-1": FakeContainer("node-1", "exited", 137, 1)}
    monkeypatch.setattr(Client, "containers", lambda self, project, stack=False: found)
    code, out, err = main(capsys, "chaos", "--kill", "node-1", "--at-step", "5", "--run-dir", str(run))
    assert code == 1 and "chaos: node-1 is exited before step 5; nothing done" in err, out + err


def test_chaos_without_a_compose_file_names_up(capsys, tmp_path, monkeypatch):
    from simcluster.launcher.drills import chaos

    monkeypatch.setattr(chaos, "START_WAIT_S", 0.3)
    code, out, err = main(capsys, "chaos", "--pause", "node-0", "--run-dir", str(tmp_path / "none"))
    assert code == 2 and "waiting for step 1 of run folder" in out
    assert "no such folder; pass the run folder of a `python -m launcher up` run (it holds compose.yml)" in err


def test_status_of_an_ended_run(capsys, tmp_path, monkeypatch):
    from simcluster.launcher.docker.client import Client

    run = _run_folder(tmp_path, capsys)
    found: dict = {}
    monkeypatch.setattr(Client, "containers", lambda self, project, stack=False: found)
    code, out, _ = main(capsys, "status", "--run-dir", str(run))
    assert code == 0 and "not running: no container of project" in out and "python -m launcher up" in out
    (run / "cluster.log").write_text("== summary: OK ==\n  run folder x\n== summary: FAILED ==\n  LOST node-1\n")
    code, out, _ = main(capsys, "status", "--run-dir", str(run))
    assert code == 0 and "not running; the last run ended at " in out
    assert f"(summary FAILED), see {run}/cluster.log for its summary" in out
    found.update(rendezvous=FakeContainer("rendezvous", "exited", 1), **{
        "node-0": FakeContainer("node-0", "exited", 0, 0), "node-1": FakeContainer("node-1", "exited", 137, 1)})
    code, out, _ = main(capsys, "status", "--run-dir", str(run))
    assert code == 0 and "node-1      1      exited 137 (SIGKILL)" in out, out
    assert "not running: the run ended at " in out
    assert "every container has exited (exit codes: node-0 0, node-1 137 (SIGKILL), rendezvous 1)" in out
    found["node-0"] = FakeContainer("node-0", "running", rank=0)
    code, out, _ = main(capsys, "status", "--run-dir", str(run))
    assert code == 0 and "running" in out and "not running" not in out, out
