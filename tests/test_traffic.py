"""Traffic accounting against closed-form counts, the merged trace's schema, and "free when off".

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_traffic.py

Runs torchrun locally (no Docker): 2x1x2 (pipeline + TP) and 2x2x1 (pipeline + FSDP), tiny
model, 3 steps, with ``--traffic 1 --trace-steps 2,3``. Expected values are the planner's closed
forms (train/plan/traffic.py), from the model shape, mesh, microbatches and the 1F1B schedule, not
read from the accounting under test; tests/test_plan.py checks them on every schedule and mesh.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import warm
from simcluster.launcher.cli import main
from simcluster.train.plan.lookup import hardware

ROOT = Path(__file__).resolve().parents[1]


def run_torchrun(mesh: str, run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    pp, dp, tp = map(int, mesh.split("x"))
    # the ranks forked after one import (as on the cluster's nodes), not stock torchrun: a third of its CPU;
    # forkrun itself forked from the worker's warm interpreter (tests/warm.py)
    args = ["--standalone", f"--nproc-per-node={pp * dp * tp}", "-m", "simcluster.train", "--mesh", mesh, "--model",
            "tiny", "--steps", "3", "--val-every", "0", "--run-dir", str(run_dir), *flags]
    proc = warm.run("simcluster.train.forkrun", args, cwd=ROOT, timeout=600,
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def expected(mesh: str, rank: int) -> dict:
    """Bytes and messages of one rank in one steady step (1F1B, default microbatches = pp): the
    planner's closed forms (train/plan/traffic.py, their one home; the model's shapes, the mesh
    and the schedule, not the accounting under test)."""
    from simcluster.core.config import Config, resolve
    from simcluster.train.plan.traffic import rank_traffic

    return rank_traffic(resolve(Config(model="tiny", mesh=mesh)), rank)


@pytest.mark.parametrize("mesh", ["2x1x2", "2x2x1"])
def test_traffic_matches_closed_form_and_trace_has_every_rank(tmp_path, mesh):
    proc = run_torchrun(mesh, tmp_path, "--traffic", "1", "--trace-steps", "2,3")
    world = math.prod(map(int, mesh.split("x")))
    for rank in range(world):
        rows = [json.loads(l) for l in (tmp_path / "traffic" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 3]
        want = expected(mesh, rank)
        for r in rows[1:]:  # step 1 also carries one 4-byte p2p message of the schedule's first step
            assert r["bytes"] == want["bytes"], (rank, r["step"])
            assert r["messages"] == want["messages"], (rank, r["step"])
            assert r["links"] == want["links"], (rank, r["step"])
    # metrics.jsonl: the world totals of each step
    metrics = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    totals = metrics[-1]["traffic"]
    assert totals["bytes"]["pp_send"] == sum(expected(mesh, r)["bytes"]["pp_send"] for r in range(world))
    assert totals["links"]["0->1"] == totals["links"]["1->0"] == world // 2 * expected(mesh, 0)["bytes"]["pp_send"]
    # the merged trace: Chrome trace-event JSON, every rank, one process per node
    trace = json.loads((tmp_path / "trace.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in xs)
    assert {e["tid"] for e in xs if e["cat"] == "compute"} == set(range(world))
    assert {e["pid"] for e in xs} == {0, 1}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"node-0", "node-1"}
    fwd = [e for e in xs if e["name"].startswith("forward mb")]
    assert len(fwd) == 2 * world * 2  # 2 traced steps x every rank x 2 microbatches
    assert "bubble step 2: measured" in proc.stdout and "textbook (p-1)/(m+p-1) 0.333" in proc.stdout
    assert (tmp_path / "profile" / "rank-0.json").exists()


OFF_PROBE = r"""
import json, sys, torch
from torch.utils._python_dispatch import _get_current_dispatch_mode
import simcluster.train.pipeline as P
from simcluster.core.config import Config
from simcluster.train.preflight import preflight
from simcluster.train.trainer import run
seen = []
orig = P.Pipeline.step
def step(self, *a, **k):
    seen.append({"mode": type(_get_current_dispatch_mode()).__name__,
                 "profiler": torch.autograd.profiler._is_profiler_enabled,
                 "traced": any(s.traced for s in self.stages)})
    return orig(self, *a, **k)
P.Pipeline.step = step
traffic = int(sys.argv[1])
job = preflight(Config(model="tiny", steps=2, val_every=0, run_dir=sys.argv[2], traffic=traffic))
assert run(job) == 0
print(json.dumps(seen))
"""


@pytest.mark.parametrize("traffic", [0, 1])
def test_no_hook_or_tracer_unless_asked(tmp_path, traffic):
    probe = tmp_path / "off_probe.py"
    probe.write_text(OFF_PROBE)
    proc = warm.run(str(probe), [str(traffic), str(tmp_path)], script=True, timeout=300, cwd=ROOT,
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(seen) == 2
    assert all(not s["profiler"] and not s["traced"] for s in seen)
    assert {s["mode"] for s in seen} == ({"TrafficMode"} if traffic else {"NoneType"})
    assert (tmp_path / "traffic").exists() == bool(traffic)


@pytest.mark.parametrize("flags, message", [
    (["--trace-steps", "9"], "trace_steps: step(s) 9 outside the run (steps 1..3)"),
    (["--trace-steps", "a"], "trace_steps: cannot parse 'a'"),
    (["--traffic", "2"], "traffic: must be 0 or 1, got 2"),
])
def test_bad_trace_or_traffic_exits_2(tmp_path, flags, message):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "train", "--model", "tiny", "--steps", "3", "--run-dir",
                           str(run_dir), *flags], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and message in proc.stderr
    assert not run_dir.exists()


@pytest.mark.docker
def test_2x2x2_cluster_shaped_traced_counts_as_closed_form(tmp_path, trainer_image, capsys):
    """The acceptance run on containers: 2x2x2 with --inter-node-bandwidth, --trace-steps and --traffic;
    then `launcher project` of it: on the network it ran on, the measured step; unshaped, shorter."""
    run = tmp_path / "acceptance"
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--mesh", "2x2x2", "--model", "tiny", "--steps", "4",
                           "--val-every", "0", "--traffic", "1", "--trace-steps", "2,3", "--inter-node-bandwidth",
                           "100mbit", "--mount-code", "--run-dir", str(run)], capture_output=True, text=True,
                          timeout=580, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for rank in range(8):
        rows = [json.loads(l) for l in (run / "traffic" / f"rank-{rank}.jsonl").read_text().splitlines()]
        want = expected("2x2x2", rank)
        assert [(r["bytes"], r["messages"], r["links"]) for r in rows[1:]] == [(want["bytes"], want["messages"],
                                                                                 want["links"])] * 3, rank
    trace = json.loads((run / "trace.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in xs if e["cat"] == "compute"} == set(range(8)) and {e["pid"] for e in xs} == {0, 1}
    assert "traffic/step " in proc.stdout and "inter-node 1.05 MB" in proc.stdout
    assert "bubble step 2: measured" in proc.stdout and "eth0 limited to 100mbit" in proc.stdout
    projected = {}
    hardware("local")  # calibrated here if no test has yet (under its lock): the subprocess's timeout is for `project`
    done = subprocess.run([sys.executable, "-m", "launcher", "project", str(run), "--json"],  # as a user runs it
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    outputs = {"": done.stdout}
    for args in (["--hardware", "local", "--inter-node-bandwidth", "10mbit"], ["--hardware", "h100-sxm-8x"]):
        capsys.readouterr()
        assert main(["project", str(run), "--json", *args]) == 0  # in this process: no second torch import
        outputs[" ".join(args)] = capsys.readouterr().out
    for args, text in outputs.items():
        data = json.loads(text)
        projected[args] = data["projected"]["total"]
        measured = data["measured_step_s"]
        assert data["traced_step"] == 2 and data["here"]["total"] == pytest.approx(measured, rel=1e-9)
    step4 = [r["step_time_s"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r.get("step") == 4 and "step_time_s" in r]
    assert step4 and measured == pytest.approx(step4[0])  # the one untraced step after the first
    # ran at 100mbit: unshaped is faster, 10mbit slower, an H100 node faster than any
    assert projected["--hardware h100-sxm-8x"] < projected[""] < measured < projected["--hardware local --inter-node-bandwidth 10mbit"]
