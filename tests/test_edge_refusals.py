"""Bad input refused at its edge (exit 2 or ConfigError naming the field, the value and the fix, nothing
written or started): tc rates, shaping between hosts, YAML 1.2 numbers, fault steps, --start-late, job
records, host chaos, the run folder and the code folder, large code folders, linked scripts, the
benchmarks' arguments; and a rank that aborts at exit after its work in the summary.

    python -m pytest -q -n 0 tests/test_edge_refusals.py

No Docker: every refusal here comes before a container or an engine is asked.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simcluster.launcher.cli import main
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def refused(capsys, argv: list[str], *named: str) -> str:
    """main(argv) exits 2 with one `error:` naming each of ``named``, no traceback; the message."""
    t0 = time.monotonic()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err and "error: " in err, err
    assert time.monotonic() - t0 < 30, "refused only after waiting"
    for word in named:
        assert word in err, (word, err)
    return err


@pytest.mark.parametrize("flags, named", [
    (["--inter-node-bandwidth", "1bit"], ["inter_node_bandwidth", "'1bit'", "below 4kbit", "100mbit"]),
    (["--inter-node-bandwidth", "2tbit"], ["inter_node_bandwidth", "'2tbit'", "above 1tbit", "100mbit"]),
    (["--inter-node-bandwidth", "100mbit"], ["--inter-node-bandwidth", "applied by `python -m launcher up`",
                                             "drop the option"]),  # a good rate: the request refuses it for generate
    (["--target", "swarm", "--hosts", "1", "--inter-host-bandwidth", "100mbit"],
     ["inter_host_bandwidth", "--hosts 1", "--hosts 2"]),
    (["--target", "swarm", "--hosts", "2", "--inter-host-bandwidth", "100mbit"],
     ["--inter-host-bandwidth 100mbit", "generate would drop it", "launcher up"]),
])
def test_generate_refuses_shaping_it_cannot_apply(capsys, tmp_path, flags, named):
    out = tmp_path / "c.yml"
    refused(capsys, ["generate", "--mesh", "2x1x1", "--model", "tiny", *flags, "--out", str(out)], *named)
    assert not out.exists()


def test_up_refuses_a_rate_tc_cannot_take_before_any_folder(capsys, tmp_path):
    run = tmp_path / "run"
    refused(capsys, ["up", "--mesh", "2x1x1", "--model", "tiny", "--inter-node-bandwidth", "7bit",
                     "--run-dir", str(run)], "'7bit'", "4kbit to 1tbit")
    assert not run.exists()


def test_numbers_python_prints_with_an_exponent_are_quoted(capsys):
    """A YAML 1.2 reader (Compose's) gets the strings the launcher wrote, not floats."""
    from simcluster.launcher.engines.document import dump

    assert main(["generate", "--mesh", "2x1x1", "--model", "tiny", "--lr", "1e-5", "--stdout"]) == 0
    text = capsys.readouterr().out
    assert "--lr, '1e-05'," in text
    values = ["1e-05", "1E5", "+1", ".5", "0o17", "0x1F", ".inf", ".NaN", "True", "null", "1e-05x", "mesh-2x2x2"]
    doc = dump({"a": values})
    assert yaml.safe_load(doc) == {"a": values}
    for v in values[:-2]:
        assert f"'{v}'" in doc, (v, doc)
    assert "- 1e-05x\n" in doc and "- mesh-2x2x2\n" in doc


def test_a_bool_step_and_a_start_late_given_twice(capsys, tmp_path):
    import simcluster
    from simcluster import Kill

    with pytest.raises(ConfigError, match=r"at_step must be an int from 1 to 10000000 \(a bool is no step\), got True; e.g. Kill\(\.\.\., at_step=3\)"):
        simcluster.run(mesh="2x1x1", model="tiny", steps=2, chaos=Kill("node-1", at_step=True),
                       run_dir=str(tmp_path / "a"))
    refused(capsys, ["up", "--mesh", "2x1x1", "--model", "tiny", "--start-late", "node-1=5", "--start-late",
                     "node-1=9", "--run-dir", str(tmp_path / "b")], "start_late", "node-1 is given twice")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def job_folder(tmp_path: Path, hosts: dict | None = None, steps: int | None = 5, compose: bool = True) -> Path:
    """A run folder as `up --hosts 2` leaves it: job.json (hosts map, last step), hosts.json, compose.yml."""
    run = tmp_path / "run"
    run.mkdir()
    job = {"nodes": {"node-0": "0", "node-1": "1"}, "nproc_per_node": 1, "world_size": 2, "image": "x"}
    if steps is not None:
        job["steps"] = steps
    if hosts is not None:
        job["hosts"] = hosts
    (run / "job.json").write_text(json.dumps(job))
    (run / "hosts.json").write_text(json.dumps({"hosts": {"host-0": "tcp://127.0.0.1:1", "host-1": "tcp://127.0.0.1:2"},
                                                "registry": "127.0.0.1:5000", "bring_up_s": 1.0}))
    if compose:
        (run / "compose.yml").write_text("services: {}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    return run


def test_report_refuses_a_truncated_hosts_map(capsys, tmp_path):
    run = job_folder(tmp_path, hosts={"node-0": "host-0"})
    refused(capsys, ["report", "--run-dir", str(run)], "job.json", "\"hosts\" map", "node-0, node-1",
            "--hosts N")
    assert not (run / "report").exists() and not [p for p in os.listdir(run) if p.startswith(".report")]


def test_host_chaos_refuses_at_once(capsys, tmp_path):
    run = job_folder(tmp_path, hosts={"node-0": "host-0", "node-1": "host-1"}, compose=False)
    base = ["chaos", "--kill-host", "host-1"]
    refused(capsys, [*base, "--run-dir", str(tmp_path / "nope")], "no such folder", "--hosts 2")
    refused(capsys, [*base, "--at-step", "9", "--run-dir", str(run)], "--at-step 9", "last step (5)",
            "--at-step 5")
    refused(capsys, [*base, "--wait-s", "nan", "--run-dir", str(run)], "wait_s", "nan", "--wait-s 600")
    (run / "hosts.json").write_text(json.dumps({"hosts": {}, "registry": "127.0.0.1:5000", "bring_up_s": 1}))
    refused(capsys, [*base, "--run-dir", str(run)], "hosts.json", "its hosts are {}")
    assert sorted(os.listdir(run)) == ["hosts.json", "job.json", "metrics.jsonl"]


def test_node_chaos_refuses_a_folder_made_by_generate_and_a_step_after_the_last(capsys, tmp_path, monkeypatch):
    from simcluster.launcher.docker.client import Client

    monkeypatch.setattr(Client, "containers", lambda self, project, stack=False: {})  # nothing of it runs
    folder = tmp_path / "gen"
    assert main(["generate", "--mesh", "2x1x1", "--model", "tiny", "--out", str(folder / "compose.yml")]) == 0
    refused(capsys, ["chaos", "--kill", "node-9", "--run-dir", str(folder)], "no job.json", "generate",
            f"--file {folder / 'compose.yml'}")
    run = job_folder(tmp_path)
    refused(capsys, ["chaos", "--kill", "node-1", "--at-step", "6", "--run-dir", str(run)], "last step (5)",
            "--kill node-1 --at-step 5")


def test_the_run_folder_is_never_the_code_folder(capsys, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    os.chmod(code, 0o750)
    before = sorted(os.listdir(code))
    refused(capsys, ["up", "--script", str(code / "train.py"), "--nodes", "1", "--nproc-per-node", "1",
                     "--run-dir", str(code)], "run_dir", str(code), "is the code folder itself", "--run-dir runs/")
    assert sorted(os.listdir(code)) == before and os.stat(code).st_mode & 0o777 == 0o750


def test_a_users_folder_keeps_its_owner_and_mode(tmp_path):
    from simcluster.launcher.job.files import make_run_dir

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    os.chmod(mine, 0o700)
    st = os.stat(mine)
    make_run_dir(str(mine), "1000:1000", None)
    after = os.stat(mine)
    assert (after.st_uid, after.st_gid, after.st_mode) == (st.st_uid, st.st_gid, st.st_mode)


def test_a_script_linked_from_outside_its_folder_is_refused(capsys, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "proj").mkdir()
    (tmp_path / "other" / "real.py").write_text("print(1)\n")
    os.symlink(tmp_path / "other" / "real.py", tmp_path / "proj" / "train.py")
    refused(capsys, ["up", "--script", str(tmp_path / "proj" / "train.py"), "--nodes", "1", "--nproc-per-node",
                     "1", "--run-dir", str(tmp_path / "run")], "script", "is a link to", "--script " +
            str(tmp_path / "other" / "real.py"))
    assert not (tmp_path / "run").exists()


def test_a_large_code_folder_is_recorded_at_once(tmp_path, monkeypatch):
    """A 64 GiB checkpoint (sparse) and 30 files beside the script: listed by size in well under a second
    (hashing it would read 64 GiB), the line says what was left out, no .partial left."""
    from simcluster.launcher.container import workdir

    code, run = tmp_path / "code", tmp_path / "run"
    code.mkdir()
    run.mkdir()
    (code / "train.py").write_text("print(1)\n")
    with open(code / "ckpt.pt", "wb") as fh:
        fh.truncate(64 * 2**30)
    for i in range(30):
        (code / f"shard-{i:02d}.bin").write_bytes(b"x" * 10)
    monkeypatch.setattr(workdir, "MAX_FILES", 25)
    t0 = time.monotonic()
    line = workdir.record(str(code), str(run))
    assert time.monotonic() - t0 < 5
    assert "ckpt.pt" in line and "1 not hashed" in line and "listing stopped at 25 files" in line, line
    rows = (run / "code.sha256").read_text().splitlines()
    assert f"-  {64 * 2**30}  ckpt.pt" in rows and len(rows) == 26
    assert sorted(os.listdir(run)) == ["code.sha256"]


def test_a_refused_up_on_hosts_leaves_no_run_folder(tmp_path, monkeypatch):
    from simcluster.launcher.engines.base import UpOptions
    from simcluster.launcher.engines.swarm import hosts, rehearse, run
    from simcluster.launcher.job.options import resolve
    from simcluster.launcher.job.request import make_request

    folder = tmp_path / "run"
    launch, command = resolve(make_request("up", mesh="2x1x1", model="tiny", target="swarm", hosts=2,
                                           run_dir=str(folder)), user="0:0")

    def bring_up(launch, show):  # as _reuse refuses kept hosts that do not fit, after the folder is made
        os.makedirs(folder)
        raise ConfigError("--hosts 2: rehearsal hosts host-0 of /elsewhere are up; rerun with --hosts 1")

    monkeypatch.setattr(run, "prepare_image", lambda launch: launch)
    monkeypatch.setattr(hosts, "bring_up", bring_up)
    with pytest.raises(ConfigError, match="--hosts 1"):
        rehearse.up(launch, command, UpOptions())
    assert not folder.exists()


@pytest.mark.parametrize("module, argv, named", [
    ("bench.overhead", ["--rounds", "-1"], "--rounds: '-1' must be a finite number > 0"),
    ("bench.overhead", ["--bogus", "3"], "unrecognized arguments: --bogus 3"),
    ("bench.overhead", ["--steps", "3", "--skip", "5"], "--steps 3 must exceed --skip 5"),
    ("bench.memory", ["--mesh", "2x1x1", "--every-s", "nan"], "--every-s: 'nan' must be a finite number > 0"),
    ("bench.memory", ["--mesh", "2x1x1", "--bogus", "3"], "unrecognized arguments for launcher up: --bogus 3"),
    ("bench.memory", ["--mesh", "2x1x1", "--cpus-per-node", "-2"], "cpus_per_node"),
])
def test_benchmarks_refuse_bad_arguments_before_anything(tmp_path, module, argv, named):
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []  # no run folder, no log


# --- a rank that aborts at exit in C++ after its work was done ------------------------------------------

def aborted_run(tmp_path: Path, total_steps: int | None, rank1_steps: int):
    """A 1 node x 2 ranks run of your code whose rank 1 recorded rank1_steps steps, then printed the
    C++ abort; its summary's text and summary.json."""
    from simcluster.launcher.instrument.spec import Instruments
    from simcluster.launcher.job.entry import resolve_code
    from simcluster.launcher.job.launch import NodeOptions
    from simcluster.launcher.observe.follow import Stream
    from simcluster.launcher.observe.summary import summarise

    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    run = tmp_path / "run"
    (run / "steps").mkdir(parents=True)
    launch = resolve_code(NodeOptions(user="0:0"), script=str(script), nodes=1, nproc_per_node=2, run_dir=str(run))
    launch = dataclasses.replace(launch, instruments=Instruments(total_steps=total_steps))
    for rank, steps in ((0, 3), (1, rank1_steps)):
        (run / "steps" / f"rank-{rank}.jsonl").write_text(
            "".join(json.dumps({"step": s, "step_time_s": 0.1, "rss_mb": 200.0}) + "\n" for s in range(1, steps + 1)))
    stream = Stream(launch, str(run / "cluster.log"), quiet=True, progress_every=10)
    shown: list[str] = []
    stream.show = shown.append
    for line in ["[rank0]:step 3 loss 0.5", "[rank1]:terminate called without an active exception"]:
        stream.handle("node-0", line)
    ok = summarise(stream, launch, str(run), {"node-0": 1, "rendezvous": 1}, 12.0)
    return ok, "\n".join(shown), json.loads((run / "summary.json").read_text())


def test_an_abort_at_exit_after_the_last_step_is_named_and_does_not_fail_the_run(tmp_path):
    ok, text, record = aborted_run(tmp_path, total_steps=3, rank1_steps=3)
    assert ok and "\n== summary: OK ==\n" in text
    assert ("rank 1 on node-0 aborted at exit (SIGABRT in gloo teardown: 'terminate called without an active "
            "exception', a C++ thread outliving the interpreter) after its last step 3; its work was done") in text
    assert record["ok"] and record["aborted_at_exit"] == [{"rank": 1, "node": "node-0", "after_step": 3}]


@pytest.mark.parametrize("total_steps, rank1_steps", [(None, 3), (3, 2)])
def test_an_abort_before_the_last_step_or_with_no_known_last_step_fails(tmp_path, total_steps, rank1_steps):
    ok, text, record = aborted_run(tmp_path, total_steps=total_steps, rank1_steps=rank1_steps)
    assert not ok and "FAILED rank 1 on node-0: terminate called without an active exception" in text
    assert "--total-steps N" in text and record["aborted_at_exit"] == []
