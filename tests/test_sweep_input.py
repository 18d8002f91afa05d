"""`launcher sweep` without Docker: the layouts, each side as `up` resolves it (the mesh kept, the
nodes moved), the comparison against the job's own layout, failed runs, and bad input (exit 2).

    python -m pytest -q tests/test_sweep_input.py
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simcluster.launcher import cli
from simcluster.launcher.compare import ComposeRun
from simcluster.launcher.sweep import layouts, plan, result_text, sweep
from simcluster.launcher.job.request import make_request
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "bugs" / "layout_bugs.py")
GOOD = [(1, 0.856526), (2, 0.865871), (3, 0.80125)]


class Fake:
    """Stands in for the cluster: the run of layout ``name`` writes outputs[name] = (exit code, its
    (step, loss) pairs, its summary lines) into its folder."""

    def __init__(self, **outputs):
        self.outputs, self.ran = outputs, []

    def check(self, sides):
        self.sides = sides

    def __call__(self, side) -> int:
        self.ran.append(side.name)
        code, series, summary = self.outputs[side.name.replace(" ", "_")]
        folder = Path(side.run_dir)
        folder.mkdir(parents=True)
        (folder / "compose.yml").write_text("services: {}\n")
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in series))
        (folder / "cluster.log").write_text("\n".join(["launcher      | progress", *summary]) + "\n")
        return code


def test_layouts_own_one_node_one_rank_per_node_each_once():
    assert [(x.nodes, x.nproc, x.name) for x in layouts(2, 4)] == [(2, 4, "own"), (1, 8, "one node"),
                                                                    (8, 1, "rank per node")]
    assert [x.text for x in layouts(2, 1)] == ["2 nodes x 1 rank", "1 node x 2 ranks"]
    assert [x.text for x in layouts(1, 4)] == ["1 node x 4 ranks", "4 nodes x 1 rank"]


def test_a_mesh_keeps_its_mesh_on_every_layout(tmp_path):
    sides = plan(make_request("up", mesh="2x2x2", model="tiny", steps=2, run_dir=str(tmp_path / "b")))
    assert [(s.launch.nnodes, s.launch.nproc_per_node, str(s.launch.mesh)) for s in sides] == \
        [(2, 4, "2x2x2"), (1, 8, "2x2x2"), (8, 1, "2x2x2")]
    assert [s.label for s in sides] == ["own (mesh 2x2x2 on 2 nodes x 4 ranks)", "one node (mesh 2x2x2 on 1 node x 8 "
                                        "ranks)", "rank per node (mesh 2x2x2 on 8 nodes x 1 rank)"]
    assert [s.run_dir for s in sides] == [str(tmp_path / "b" / f) for f in ("nodes-2x4", "nodes-1x8", "nodes-8x1")]
    assert sides[0].up_line.startswith("python -m launcher up --mesh 2x2x2 ")
    assert sides[1].command.startswith("python -m launcher sweep --mesh 2x2x2 ") and "no `up` line" in sides[1].command
    argv = [[a for a in s.launch.argv if "nodes-" not in a] for s in sides]  # the trainer's flags, but its run folder
    assert all(s.launch.train is not None for s in sides) and argv[0] == argv[1] == argv[2] and "--mesh" in argv[0]


def test_agreement_and_the_first_step_and_layout_that_differ(tmp_path, capsys):
    differs = [(1, 0.856526), (2, 0.9), (3, 0.95)]
    fake = Fake(own=(0, GOOD, []), one_node=(0, GOOD, []), rank_per_node=(0, differs, []))
    kw = dict(script=SCRIPT, nodes=2, nproc_per_node=2, args=["--steps", "3"], run_dir=str(tmp_path / "b"), runner=fake)
    s = sweep(**kw)
    assert fake.ran == ["own", "one node", "rank per node"] and not s.ok
    step, run = s.first
    assert step == 2 and run.side.label == "rank per node (4 nodes x 1 rank)"
    text = result_text(s)
    assert "sweep: DIFFERS: loss first differs at step 2: rank per node (4 nodes x 1 rank) 0.9 against 0.865871 on " \
           "own (2 nodes x 2 ranks) (rel diff 3.9e-02 > rtol 1e-05)" in text
    rows = [line.split() for line in text.splitlines()[2:5]]
    assert rows[1] == ["2", "0.865871", "0.865871", "0.0e+00", "0.9", "3.9e-02"], text
    assert "LOCAL_RANK" in text and "python -m launcher up --run-dir" in capsys.readouterr().out
    fake = Fake(own=(0, GOOD, []), one_node=(0, GOOD, []), rank_per_node=(0, GOOD, []))
    s = sweep(**{**kw, "runner": fake})
    assert s.ok and s.first is None
    assert result_text(s).endswith("sweep: OK: loss agrees within rtol 1e-05 at all 3 steps on every layout: own (2 "
                                   "nodes x 2 ranks), one node (1 node x 4 ranks), rank per node (4 nodes x 1 rank)")


def test_a_failed_layout_differs_at_its_first_missing_step_and_the_sweep_goes_on(tmp_path):
    summary = ["== summary: FAILED ==", "  FAILED rank 1 on node-1: FileNotFoundError: /tmp/init.pt"]
    fake = Fake(own=(1, [], summary), one_node=(0, GOOD, []))
    s = sweep(script=SCRIPT, nodes=2, nproc_per_node=1, run_dir=str(tmp_path / "b"), runner=fake)
    assert fake.ran == ["own", "one node"] and not s.ok and s.first[0] == 1
    text = result_text(s)
    assert "sweep: own (2 nodes x 1 rank) failed (exit 1): FAILED rank 1 on node-1: FileNotFoundError" in text
    assert "first differs at step 1: one node (1 node x 2 ranks) 0.856526, own (2 nodes x 1 rank) has no value" in text


def test_an_option_of_up_the_sweep_does_not_take_is_named_as_such(tmp_path, capsys):
    """`--target swarm` on the command line: an option of `up`, not one of your code's (argparse's exit 2)."""
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--script", SCRIPT, "--nodes", "2", "--nproc-per-node", "1", "--target", "swarm",
                  "--run-dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and " sweep [-h] " in err.splitlines()[0], err  # sweep's usage
    assert (" sweep: error: unrecognized arguments: --target swarm; --target: an option of `up` that sweep does not "
            "take (its options: python -m launcher sweep --help)") in err and not (tmp_path / "b").exists()


def test_a_metric_the_own_layout_lacks_stops_the_sweep(tmp_path):
    fake = Fake(own=(0, GOOD, []), one_node=(0, GOOD, []))
    with pytest.raises(ConfigError, match=r"--metric lsos: .* \(the other layouts were not run\)"):
        sweep(script=SCRIPT, nodes=2, nproc_per_node=1, run_dir=str(tmp_path / "b"), runner=fake, metric="lsos")
    assert fake.ran == ["own"]


@pytest.mark.parametrize("args,message", [
    (["--nodes", "2", "--nproc-per-node", "1", "--rtol", "-1"], "--rtol: must be a finite number in [0, 1]"),
    (["--nodes", "2"], "nproc_per_node"),
    (["--nodes", "2", "--nproc-per-node", "1", "--metric-regex", "(a)(b)"], "--metric-regex: "),
])
def test_bad_input_exits_2_before_anything_starts(tmp_path, capsys, args, message):
    base = tmp_path / "runs"
    assert cli.main(["sweep", "--script", SCRIPT, "--run-dir", str(base), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and not base.exists(), err
    with pytest.raises(ConfigError, match="target: the sweep runs each layout on the compose simulation"):
        sweep(script=SCRIPT, nodes=2, nproc_per_node=1, target="swarm", runner=Fake())


@pytest.mark.parametrize("args,message", [
    (["--metric", "lsos"], "--metric lsos: the built-in trainer logs no such number in its metrics.jsonl (val_loss only "
                           "with --val-every above 0); name one of loss, val_loss, lr, grad_norm, tokens_per_s, "
                           "step_time_s, e.g. --metric loss"),
    (["--metric", "val_loss", "--val-every", "0"], "name one of loss, lr, grad_norm, tokens_per_s, step_time_s"),
    (["--metric", "grad_norm", "--metric-regex", r"loss (\S+)"], "--metric grad_norm: no effect with --metric-regex"),
])
def test_a_metric_the_built_in_trainer_never_logs_exits_2_before_the_first_run(tmp_path, capsys, args, message):
    """Before: refused after the own layout's whole run (the others not run)."""
    base = tmp_path / "runs"
    assert cli.main(["sweep", "--mesh", "2x1x1", "--model", "tiny", "--steps", "2", "--run-dir", str(base), *args]) == 2
    out, err = capsys.readouterr()
    assert message in err and out == "" and not base.exists(), err


def test_cli_exit_codes(tmp_path, monkeypatch, capsys):
    outputs = {"own": GOOD, "one node": GOOD[:2]}

    def run(self, side):
        return Fake(**{side.name.replace(" ", "_"): (0, outputs[side.name], [])})(side)

    monkeypatch.setattr(ComposeRun, "check", lambda self, sides: None)
    monkeypatch.setattr(ComposeRun, "__call__", run)
    argv = ["sweep", "--script", SCRIPT, "--nodes", "2", "--nproc-per-node", "1", "--run-dir", str(tmp_path / "b")]
    assert cli.main(argv + ["--", "--steps", "3"]) == 1
    out = capsys.readouterr().out
    assert "first differs at step 3: one node (1 node x 2 ranks) has no value there (0.80125 on own" in out
    outputs["one node"] = GOOD
    assert cli.main(argv + ["--quiet", "--", "--steps", "3"]) == 0
    assert "sweep: OK: loss agrees" in capsys.readouterr().out


class Printed(Fake):
    """A side whose code only prints its loss (``step N loss X`` on rank 0, as `up`'s summary reads it) and
    whose metrics.jsonl rows hold the instruments' keys but no loss."""

    def __call__(self, side) -> int:
        code = super().__call__(side)
        folder = Path(side.run_dir)
        series = self.outputs[side.name.replace(" ", "_")][1]
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rss_mb": 50.0}) + "\n" for s, _ in series))
        (folder / "cluster.log").write_text("".join(f"node-0 r0    | step {s} loss {v}\n" for s, v in series))
        return code


def test_a_loss_the_ranks_only_print_is_read_as_up_reads_it(tmp_path):
    """No "loss" in the rows and no --metric-regex: the printed loss, in the common formats (series_read.LOSS_REGEX)."""
    differs = [(1, 0.856526), (2, 0.9), (3, 0.95)]
    fake = Printed(own=(0, GOOD, []), one_node=(0, differs, []), rank_per_node=(0, GOOD, []))
    s = sweep(script=SCRIPT, nodes=2, nproc_per_node=2, args=["--steps", "3"], run_dir=str(tmp_path / "b"),
              runner=fake)
    step, run = s.first
    assert not s.ok and step == 2 and run.side.label == "one node (1 node x 4 ranks)", result_text(s)
