"""`launcher compare` without Docker: bad input exits 2 before anything starts, and the flow of
launcher/compare.py (fresh folders, the metric read from metrics.jsonl or the ranks' lines, failed
runs, a metric one run lacks) with a stand-in for the cluster runs.

    python -m pytest -q tests/test_compare_input.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.launcher import cli
from simcluster.launcher.compare import ComposeRun, RunFailed, compare
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "manual_3d.py")
GOOD = [{"step": s, "loss": v, "total_steps": 3} for s, v in ((1, 0.7218401), (2, 0.8116353), (3, 0.7675373))]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "compare", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


BAD = [
    (["--mesh", "2x2x2", "--against", "2x2x1", "--rtol", "-1e-5"], "--rtol: must be a finite number in [0, 1]"),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--rtol", "nan"], "--rtol: must be a finite number in [0, 1]"),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--steps", "3"],
     "unrecognized arguments: --steps 3; compare takes no trainer options: your code's arguments go after --"),
    (["--mesh", "2x2x2"], "--against: give B's layout as --against PPxDPxTP"),
    (["--against", "2x2x1"], "--mesh: give A's layout as --mesh PPxDPxTP"),
    (["--mesh", "2x2x2", "--against-nodes", "1"], "--against-nodes: give B's layout"),
    (["--mesh", "2x2x2", "--against", "2x2"], "--against: mesh: cannot parse '2x2'"),
    (["--mesh", "2x2x2", "--nodes", "1", "--nproc-per-node", "1", "--against", "1x1x1"],
     "--mesh: A's layout is either --mesh or --nodes with --nproc-per-node, not both"),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--metric-regex", r"(\d+) (\d+)"], "--metric-regex: "),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--metric", " "], "--metric: empty"),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--cpus-per-node", "0"], "cpus_per_node: must be >= 0.01"),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--metric", "loss", "--metric-regex", r"loss (\S+)"],
     r"--metric loss: no effect with --metric-regex 'loss (\S+)' (--metric reads a key of metrics.jsonl's rows, "
     r"--metric-regex the lines the ranks print); give one, e.g. --metric loss or --metric-regex 'loss (\S+)'"),
    (["--mesh", "2x2x2", "--against", "2x2x1", "--metric", "step"], "--metric step: not a number a step logs (step, "
     "traffic, device_peak_mb are the step axis and per-rank objects); name a number of your metrics.jsonl rows"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_before_anything_starts(tmp_path, args, message):
    base = tmp_path / "runs"
    proc = run_cli("--script", SCRIPT, "--run-dir", str(base), *args, "--", "--steps", "3")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and proc.stdout == "", proc.stderr
    assert not base.exists()


def test_an_empty_run_dir_is_refused_not_this_folder(tmp_path):
    """compare --run-dir '' was the current folder: its a-/b- folders emptied and run into."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "compare", "--script", SCRIPT, "--mesh", "2x2x2",
                           "--against", "2x2x1", "--run-dir", ""], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "run_dir: must be text, not empty or blank (to take the default, leave --run-dir out), got ''" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_missing_script_and_the_built_in_trainer_exit_2(tmp_path):
    proc = run_cli("--script", str(tmp_path / "nope.py"), "--mesh", "2x2x2", "--against", "2x2x1")
    assert proc.returncode == 2 and f"script: {tmp_path / 'nope.py'} does not exist" in proc.stderr
    proc = run_cli("--mesh", "2x2x2", "--against", "2x2x1")
    assert proc.returncode == 2 and "compare runs your own code" in proc.stderr and "train.parity" in proc.stderr


class Fake:
    """Stands in for the cluster: each side writes what outputs[name] holds (exit code, metrics
    rows, lines of its ranks, its summary) into its run folder."""

    def __init__(self, **outputs):
        self.outputs, self.ran = outputs, []

    def check(self, sides):
        self.sides = sides

    def __call__(self, side) -> int:
        self.ran.append(side.name)
        code, rows, lines, summary = self.outputs[side.name]
        folder = Path(side.run_dir)
        folder.mkdir(parents=True)
        (folder / "compose.yml").write_text("services: {}\n")
        if rows is not None:
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        log = [f"node-0 r0     | {line}" for line in lines] + ["launcher      | progress: step 3/3 loss 9.9", *summary]
        (folder / "cluster.log").write_text("\n".join(log) + "\n")
        return code


def call(tmp_path, fake, **kw):
    args = dict(script=SCRIPT, mesh="2x2x2", against_nodes=1, against_nproc_per_node=1, args=["--steps", "3"],
                run_dir=str(tmp_path / "base"), runner=fake)
    return compare(**{**args, **kw})


def test_ok_into_fresh_folders_a_and_b(tmp_path, capsys):
    stale = tmp_path / "base" / "b-nodes-1x1"
    stale.mkdir(parents=True)
    (stale / "compose.yml").write_text("")
    (stale / "state.json").write_text("{}")  # an earlier run's resume state: gone before the runs
    fake = Fake(A=(0, GOOD, [], []), B=(0, GOOD, [], []))
    c = call(tmp_path, fake)
    assert c.ok and fake.ran == ["A", "B"] and not (stale / "state.json").exists()
    assert [s.run_dir for s in fake.sides] == [str(tmp_path / "base" / "a-mesh-2x2x2"), str(stale)]
    assert c.labels == ("A (mesh 2x2x2)", "B (1 node x 1 rank)")
    assert fake.sides[1].up_line == (f"python -m launcher up --run-dir {stale} --script examples/manual_3d.py "
                                     f"--nodes 1 --nproc-per-node 1 -- --steps 3")
    out = capsys.readouterr().out
    assert f"compare: run A (mesh 2x2x2) into {tmp_path / 'base' / 'a-mesh-2x2x2'}" in out


def test_divergence_and_lengths_from_the_ranks_lines(tmp_path):
    lines_a = ["rank=0 host=node-0", "step 1/3 loss 0.721840", "step 2/3 loss 0.823000", "step 3/3 loss 0.700000"]
    lines_b = ["step 1/2 loss 0.721840", "step 2/2 loss 0.811635"]
    c = call(tmp_path, Fake(A=(0, None, lines_a, []), B=(0, None, lines_b, [])), mesh=None, nodes=2,
             nproc_per_node=2, against="2x2x1", against_nodes=None, against_nproc_per_node=None,
             metric_regex=r"^step (?P<step>\d+)/\d+ loss (?P<value>\S+)")
    assert not c.ok and (c.first_divergence.step, c.first_divergence.a, c.first_divergence.b) == (2, 0.823, 0.811635)
    assert c.only_a == ((3, 0.7),) and c.labels == ("A (2 nodes x 2 ranks)", "B (mesh 2x2x1)")


def test_a_metric_run_a_lacks_exits_2_without_running_b(tmp_path):
    fake = Fake(A=(0, GOOD, [], []), B=(0, GOOD, [], []))
    with pytest.raises(ConfigError, match=r"--metric lsos: run A \(mesh 2x2x2\)'s steps \(.*a-mesh-2x2x2/metrics.jsonl "
                                          r"and the instruments' steps/\) have no 'lsos' in their 3 rows; their keys: "
                                          r"loss, step, total_steps; .*B was not run"):
        call(tmp_path, fake, metric="lsos")
    assert fake.ran == ["A"]
    with pytest.raises(ConfigError, match=r"run A \(mesh 2x2x2\) wrote no .*metrics.jsonl; append"):
        call(tmp_path, Fake(A=(0, None, [], []), B=(0, GOOD, [], [])))


def test_rows_of_one_step_are_merged_a_later_row_winning(tmp_path):
    """As summary and report read them (rundir.step_rows): e.g. simcluster.log rows of several ranks."""
    rows = [{"step": 1, "loss": 9.0}, {"step": 1, "loss": 0.7218401, "lr": 0.1}] + GOOD[1:]
    c = call(tmp_path, Fake(A=(0, rows, [], []), B=(0, GOOD, [], [])))
    assert c.ok and c.rows[0].a == 0.7218401


def test_a_metric_only_run_b_lacks_is_a_failed_comparison(tmp_path):
    rows_b = [{"step": r["step"], "val": 1.0} for r in GOOD]
    with pytest.raises(RunFailed, match=r"run B \(1 node x 1 rank\)'s .* have no 'loss' in their 3 rows; their "
                                        r"keys: step, val; .*; run A \(mesh 2x2x2\) logged 3 step\(s\) of it"):
        call(tmp_path, Fake(A=(0, GOOD, [], []), B=(0, rows_b, [], [])))


def test_a_failed_run_names_its_layout_and_failing_rank(tmp_path):
    summary = ["== summary: FAILED ==", "  node-0       ranks 0-3      exit 1", "  node-1       ranks 4-7      exit 1",
               "  FAILED rank 4 on node-1: ValueError: layers 4 cannot split into 3 stages", "      File ..."]
    fake = Fake(A=(1, None, [], summary), B=(0, GOOD, [], []))
    with pytest.raises(RunFailed, match=r"run A \(mesh 2x2x2\) failed \(exit 1\): FAILED rank 4 on node-1: ValueError: "
                                        r"layers 4 cannot split into 3 stages; B was not run; can your code take this "
                                        r"layout \(8 ranks\)"):
        call(tmp_path, fake)
    assert fake.ran == ["A"]


def test_a_folder_compare_did_not_make_is_refused(tmp_path):
    mine = tmp_path / "base" / "a-mesh-2x2x2"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    fake = Fake(A=(0, GOOD, [], []), B=(0, GOOD, [], []))
    with pytest.raises(ConfigError, match=r"holds files but is no run folder \(no compose.yml\)"):
        call(tmp_path, fake)
    assert fake.ran == [] and (mine / "notes.txt").exists()


def test_node_options_by_name_apply_to_both_runs(tmp_path):
    fake = Fake(A=(0, GOOD, [], []), B=(0, GOOD, [], []))
    assert call(tmp_path, fake, mount_code=True, cpus_per_node=1.5, timeout_s=30, total_steps=3).ok
    for side in fake.sides:
        assert side.launch.node.mount_code and side.launch.node.cpus_per_node == 1.5 and side.launch.timeout_s == 30
        assert "--cpus-per-node 1.5 --mount-code" in side.up_line and "--timeout-s 30.0" in side.up_line
        assert "--total-steps 3" in side.up_line


def test_the_same_layout_twice_is_a_determinism_check(tmp_path, capsys):
    c = call(tmp_path, Fake(A=(0, GOOD, [], []), B=(0, GOOD, [], [])), against_nodes=None,
             against_nproc_per_node=None, against="2x2x2")
    assert c.ok and "A and B are the same layout (mesh 2x2x2)" in capsys.readouterr().out


def test_cli_exit_codes_and_table(tmp_path, monkeypatch, capsys):
    outputs = {"A": GOOD, "B": GOOD[:2] + [{"step": 3, "loss": 0.7}]}

    def run(self, side):
        return Fake(**{side.name: (0, outputs[side.name], [], [])})(side)

    monkeypatch.setattr(ComposeRun, "check", lambda self, sides: None)
    monkeypatch.setattr(ComposeRun, "__call__", run)
    argv = ["compare", "--script", SCRIPT, "--mesh", "2x2x2", "--against", "2x2x1", "--run-dir", str(tmp_path / "b")]
    assert cli.main(argv + ["--", "--steps", "3"]) == 1
    out = capsys.readouterr().out
    assert "   3       0.7675373             0.7   9.6e-02" in out
    assert ("loss diverges at step 3: A (mesh 2x2x2) 0.7675373, B (mesh 2x2x1) 0.7 (rel diff 9.6e-02 > rtol 1e-05)"
            in out)
    assert out.rstrip().endswith("compare: FAILED: loss differs beyond rtol 1e-05 or in its steps (above)")
    assert cli.main(argv + ["--rtol", "0.1", "--", "--steps", "3"]) == 0
    assert "compare: OK: loss of A (mesh 2x2x2) and B (mesh 2x2x1) agree within rtol 0.1 at all 3 steps" in \
        capsys.readouterr().out
