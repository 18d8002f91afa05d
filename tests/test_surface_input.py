"""Every surface refuses bad input at the edge: plan, project, report, chaos, build, status, logs, down.

    python -m pytest -q -n 0 tests/test_surface_input.py

Each case: exit 2 (ConfigError through launcher/cli.py main), the field (or file and line) named in
the message, no traceback, nothing written (no report/ folder, no half-written one). No Docker: every
refusal comes before a container is looked at.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from simcluster.launcher.cli import main

ROWS = [{"step": s, "total_steps": 3, "loss": 5.5 - 0.1 * s, "tokens_per_s": 1000.0 + s, "step_time_s": 0.2,
         "rss_mb": [300.0, 310.0]} for s in (1, 2, 3)]
CONFIG = "mesh: 2x1x1\nmodel: tiny\nsteps: 3\nmicrobatches: 2\nglobal_batch: 16\ntrace_steps: '2'\ntraffic: 1\n"
COMPOSE = """services:
  rendezvous:
    image: simcluster/trainer:latest
  node-0:
    image: simcluster/trainer:latest
    labels: {io.simcluster.ranks: '0'}
  node-1:
    image: simcluster/trainer:latest
    labels: {io.simcluster.ranks: '1'}
"""


def run_folder(tmp_path: Path, rows: list | None = None, config: str = CONFIG) -> Path:
    """A run folder as `launcher up` leaves it (metrics.jsonl, config.yaml, compose.yml, job.json)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (ROWS if rows is None else rows)))
    (run / "config.yaml").write_text(config)
    (run / "compose.yml").write_text(COMPOSE)
    (run / "job.json").write_text(json.dumps({"nodes": {"node-0": "0", "node-1": "1"}, "nproc_per_node": 1,
                                              "world_size": 2, "image": "simcluster/trainer:latest"}))
    return run


def refused(capsys, argv: list[str], *named: str) -> str:
    """main(argv) exits 2, stdout empty, stderr one `error:` naming each of ``named``, no traceback."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err + out and (err.startswith("error: ") or "\nerror: " in err), err
    for word in named:
        assert word in err, (word, err)
    return err


# --- plan: a flag that has no effect where it stands is an error saying why ---------------------------

@pytest.mark.parametrize("argv, named", [
    (["--hardware", "", "--mesh", "2x1x1"], ["hardware", "''", "h100-sxm-8x"]),
    (["--hardware", "nope", "--mesh", "2x1x1"], ["hardware", "'nope'", "h100-sxm-8x"]),
    (["--world-size", "8", "--mesh", "2x1x1"], ["world_size", "--world-size 8", "--search"]),
    (["--recalibrate", "--mesh", "2x1x1"], ["recalibrate", "--hardware local"]),
    (["--recalibrate", "--hardware", "h100-sxm-8x", "--mesh", "2x1x1"], ["recalibrate", "h100-sxm-8x"]),
    (["--search", "--world-size", "2", "--recalibrate", "--hardware", "a100-80g-8x"], ["recalibrate", "a100"]),
    (["--search", "--world-size", "2", "--mesh", "2x1x1"], ["search", "--mesh"]),
    (["--search"], ["search", "--world-size"]),
    (["--memory-per-rank", "1e999", "--mesh", "2x1x1"], ["memory_per_rank", "inf"]),
    (["--memory-per-rank", "nan", "--mesh", "2x1x1"], ["memory_per_rank", "nan"]),
    (["--memory-per-rank", "0", "--mesh", "2x1x1"], ["memory_per_rank", "0"]),
])
def test_plan_refuses(capsys, argv, named):
    refused(capsys, ["plan", "--model", "tiny", *argv], *named)


# --- project: the run folder read through simcluster/core/rundir.py, the rate checked --------------------------

def test_project_refuses_a_missing_folder_and_a_file(capsys, tmp_path):
    refused(capsys, ["project", str(tmp_path / "nothere"), "--hardware", "h100-sxm-8x"], "RUN_DIR", "(nothing there)")
    (tmp_path / "f").write_text("x")
    refused(capsys, ["project", str(tmp_path / "f"), "--hardware", "h100-sxm-8x"], "RUN_DIR", "not a folder")


def test_project_refuses_an_empty_folder(capsys, tmp_path):
    refused(capsys, ["project", str(tmp_path), "--hardware", "h100-sxm-8x"], "config.yaml", "--traffic 1")


@pytest.mark.parametrize("config, named", [
    (CONFIG[:30] + "\n  - [", ["config.yaml line", "not YAML"]),  # truncated mid-write
    ("{{{: [\n", ["config.yaml line 1", "not YAML"]),  # garbage
    ("- 1\n- 2\n", ["config.yaml", "not a mapping"]),
    ("mesh: 2x1x1\nsteps: many\n", ["config.yaml", "steps"]),  # a string where a number belongs
])
def test_project_refuses_a_bad_config(capsys, tmp_path, config, named):
    run = run_folder(tmp_path, config=config)
    refused(capsys, ["project", str(run), "--hardware", "h100-sxm-8x"], *named)


def test_project_refuses_an_overflowing_rate_and_an_empty_hardware(capsys, tmp_path):
    run = run_folder(tmp_path)
    refused(capsys, ["project", str(run), "--inter-node-bandwidth", "9" * 400 + "mbit"], "inter_node_bandwidth",
            "100mbit")
    refused(capsys, ["project", str(run), "--inter-node-bandwidth", "1e999mbit"], "inter_node_bandwidth")
    refused(capsys, ["project", str(run), "--hardware", ""], "hardware", "h100-sxm-8x")


def test_rundir_names_the_file_and_line(tmp_path):
    """The one reader: a cut last line, a string where a number belongs, a non-object row."""
    from simcluster.core.errors import ConfigError
    from simcluster.core.rundir import read_metrics

    run = run_folder(tmp_path)
    path = run / "metrics.jsonl"
    for text, named in ((path.read_text()[:-20], "line 3: not JSON (cut short"),
                        (json.dumps({"step": 1, "step_time_s": "fast"}) + "\n", "line 1: step_time_s is 'fast'"),
                        (json.dumps({"step": "2"}) + "\n", "line 1: step is '2', not an integer"),
                        ("[1, 2]\n", "line 1: not a JSON object"),
                        (json.dumps({"step": 1, "rss_mb": ["a"]}) + "\n", "line 1: rss_mb")):
        path.write_text(text)
        with pytest.raises(ConfigError, match="fix or delete that line, e.g.") as e:
            read_metrics(str(run), strict=True)
        assert f"{path} {named}" in str(e.value)
        read_metrics(str(run))  # lenient readers (progress, summary) skip it


# --- report: refused whole, nothing left behind -----------------------------------------------------

def _no_report(run: Path) -> None:
    assert not (run / "report").exists()
    assert not [p for p in os.listdir(run) if p.startswith(".report-")], os.listdir(run)


@pytest.mark.parametrize("corrupt, named", [
    (lambda run: (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text()[:-25]),
     ["metrics.jsonl line 3", "not JSON"]),
    (lambda run: (run / "metrics.jsonl").write_text(json.dumps({**ROWS[0], "loss": "x"}) + "\n"),
     ["metrics.jsonl line 1", "loss is 'x'"]),
    (lambda run: (run / "config.yaml").write_text(CONFIG[:25] + "\n  - ["), ["config.yaml line", "not YAML"]),
    (lambda run: (run / "trace.json").write_text('{"traceEvents": [{"ph": "X", "na'), ["trace.json", "not JSON"]),
    (lambda run: (run / "trace.json").write_text('{"traceEvents": [{"ph": "X", "name": "f", "ts": "0"}]}'),
     ["trace.json", "event 0 has ts"]),
    (lambda run: (run / "metrics.jsonl").write_text(""), ["no record", "step"]),
])
def test_report_refuses_a_corrupt_folder_and_writes_nothing(capsys, tmp_path, corrupt, named):
    run = run_folder(tmp_path)
    corrupt(run)
    refused(capsys, ["report", "--run-dir", str(run)], *named)
    _no_report(run)


def test_report_refuses_an_empty_folder_a_file_and_a_missing_one(capsys, tmp_path):
    refused(capsys, ["report", "--run-dir", str(tmp_path)], "metrics.jsonl")
    _no_report(tmp_path)
    (tmp_path / "f").write_text("x")
    refused(capsys, ["report", "--run-dir", str(tmp_path / "f")], "--run-dir", "not a folder")
    refused(capsys, ["report", "--run-dir", str(tmp_path / "gone")], "--run-dir", "is not a folder (nothing there)")


def test_report_keeps_the_previous_report_on_failure_and_replaces_it_whole(capsys, tmp_path):
    run = run_folder(tmp_path)
    (run / "report").mkdir()
    (run / "report" / "index.html").write_text("old")
    (run / "config.yaml").write_text("{{{: [\n")
    refused(capsys, ["report", "--run-dir", str(run)], "config.yaml")
    assert (run / "report" / "index.html").read_text() == "old"
    (run / "config.yaml").write_text(CONFIG)
    assert main(["report", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert (run / "report" / "index.html").read_text() != "old" and (run / "report" / "loss.png").is_file()
    assert sorted(os.listdir(run)) == ["compose.yml", "config.yaml", "job.json", "metrics.jsonl", "report"]


# --- chaos: refused at once, before any wait --------------------------------------------------------

@pytest.mark.parametrize("argv, named", [
    (["--kill", "node-7"], ["--kill node-7", "no such node", "node-0 (ranks 0), node-1 (ranks 1)"]),
    (["--pause", "node-1", "--at-step", "0"], ["at_step", "--at-step 0"]),
    (["--pause", "node-1", "--at-step=-2"], ["at_step", "--at-step -2"]),
    (["--stop", "node-1", "--wait-s", "1e999"], ["wait_s", "inf"]),
    (["--stop", "node-1", "--wait-s", "0"], ["wait_s"]),
    (["--freeze", "5"], ["--freeze 5", "ranks 0-1"]),
    (["--freeze=-1"], ["--freeze -1", "rank"]),
    (["--kill", ""], ["--kill ''", "names no node"]),
])
def test_chaos_refuses_at_once(capsys, tmp_path, argv, named):
    run = run_folder(tmp_path)
    refused(capsys, ["chaos", *argv, "--run-dir", str(run)], *named)


# --- status, logs, down, chaos: what they act on ----------------------------------------------------

@pytest.mark.parametrize("command", ["status", "logs", "down", "chaos"])
def test_compose_commands_refuse_a_bad_target(capsys, tmp_path, command):
    extra = ["--kill", "node-1", "--wait-s", "1"] if command == "chaos" else []
    (tmp_path / "f").write_text("hello: [1]\n")
    refused(capsys, [command, *extra, "--file", str(tmp_path / "nofile.yml")], "--file", "no such compose file")
    refused(capsys, [command, *extra, "--file", str(tmp_path)], "--file", "--run-dir")
    refused(capsys, [command, *extra, "--run-dir", str(tmp_path / "f")], "--run-dir", "not a folder")
    if command != "chaos":  # chaos waits for `up` to make a folder it names
        refused(capsys, [command, "--run-dir", str(tmp_path / "gone")], "--run-dir", "no such folder")
        refused(capsys, [command, "--run-dir", str(tmp_path)], "--run-dir", "compose.yml")


# --- build ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, named", [
    (["--check", "--cache-key"], ["--check or --cache-key"]),
    (["--force", "--check"], ["force", "--check"]),
    (["--force", "--cache-key"], ["force", "--cache-key"]),
])
def test_build_refuses_flags_without_effect(capsys, argv, named):
    refused(capsys, ["build", *argv], *named)
