"""The instruments of the user's own code, on the host (no Docker): the rules of each part.

    python -m pytest -q tests/test_instruments.py

The step clock with one and several optimizers and with simcluster.step(); the sitecustomize that
loads it (a no-op without RANK, in a child interpreter, and with torch never imported); the
logging API; the traffic kinds by mesh dimension; the run-folder join the launcher reads
(step_rows, StepsTail); the flags a script job takes and refuses, and the environment every
engine's document carries. The same code on containers: tests/test_user_code.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simcluster.launcher.instrument.spec import Instruments
from simcluster.core.layout import mesh_groups
from simcluster.core.rundir import StepsTail, step_rows

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "launcher" / "instrument" / "boot"


def rank_env(out: Path, **extra) -> dict:
    """The environment a rank of the user's code gets on the cluster (node.py + torchrun), one process."""
    return {**os.environ, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}", "SIMCLUSTER_INSTRUMENT": "1", "RANK": "0",
            "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "SIMCLUSTER_OUTPUT_DIR": str(out), "OMP_NUM_THREADS": "1",
            **extra}


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in folder.read_text().splitlines()]


def test_spec_round_trips_through_the_environment():
    inst = Instruments(traffic=True, trace_steps=(2, 3), total_steps=7, cpu_bridges=False)
    env = inst.env()
    assert env == {"SIMCLUSTER_TRAFFIC": "1", "SIMCLUSTER_TRACE_STEPS": "2,3", "SIMCLUSTER_TOTAL_STEPS": "7",
                   "SIMCLUSTER_CPU_BRIDGES": "0"}
    assert Instruments.from_env(env) == inst and Instruments().env() == {} and Instruments.from_env({}) == Instruments()


def test_mesh_groups_follow_init_device_mesh():
    import torch  # noqa: F401 - the layout is checked against torch's own mesh below

    mesh = __import__("torch").arange(8).reshape(2, 2, 2)  # (pp, dp, tp), pp outermost
    for rank in range(8):
        pp_i, dp_i, tp_i = rank // 4, (rank // 2) % 2, rank % 2
        g = mesh_groups(rank, 2, 2, 2)
        assert g["pp"] == tuple(mesh[:, dp_i, tp_i].tolist()) and g["dp"] == tuple(mesh[pp_i, :, tp_i].tolist())
        assert g["tp"] == tuple(mesh[pp_i, dp_i, :].tolist()) and g["world"] == tuple(range(8))
    assert set(mesh_groups(0, 1, 1, 4)) == {"world", "tp"}  # size-1 dimensions never communicate


def test_collective_kinds_name_the_mesh_dimension():
    from simcluster.train.traffic import collective_kind

    assert collective_kind("all_reduce", True, {"tp", "world"}) == "tp_all_reduce"  # DTensor's, 1x1x2
    assert collective_kind("all_reduce", False, {"tp", "world"}) == "world_all_reduce"  # clipping's, 1x1x2
    assert collective_kind("all_gather", False, {"dp"}) == "fsdp_all_gather"
    assert collective_kind("all_reduce", False, {"dp"}) == "dp_all_reduce"  # DDP over a dp group
    assert collective_kind("all_gather", True, {"tp"}) == "tp_all_gather"  # sequence parallel
    assert collective_kind("broadcast", False, {"world"}) == "world_broadcast"
    assert collective_kind("all_reduce", False, set()) == "all_reduce"  # a group of the user's own


SCRIPT = '''
import sys, torch
a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
for _ in range(3):
    (a(torch.ones(1, 2)).sum() + b(torch.ones(1, 2)).sum()).backward()
    opt_a.step(); opt_b.step()   # two optimizers: one step each, one training step
if sys.argv[1:] == ["marks"]:
    import simcluster
    for _ in range(2):
        opt_a.step(); opt_a.step()   # gradient accumulation the script counts as one step
        simcluster.step()
    simcluster.log(loss=torch.tensor(0.25), total_steps=5)
print("modules", "torch" in sys.modules, flush=True)
'''


def test_the_clock_counts_the_first_optimizer_and_then_explicit_marks(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "s.py", "marks"], cwd=tmp_path, env=rank_env(out), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    steps = records(out / "steps" / "rank-0.jsonl")
    # 3 optimizer steps (of opt_a); then 2 more before the first mark; from the mark on, marks only (6, 7)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6, 7]
    assert all(s["step_time_s"] > 0 and s["rss_mb"] > 10 and s["restart"] == 0 for s in steps)
    assert records(out / "metrics.jsonl") == [{"step": 7, "total_steps": 5, "loss": 0.25}]  # step: the clock's
    rows = step_rows(str(out))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7] and rows[-1]["loss"] == 0.25
    assert len(rows[0]["rss_mb"]) == 1


def test_sitecustomize_is_a_no_op_outside_a_rank(tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")  # the clock would have made steps/ at its start
    for drop, extra in (("RANK", {}), (None, {"SIMCLUSTER_INSTRUMENT_PID": "1"}), ("SIMCLUSTER_INSTRUMENT", {})):
        out = tmp_path / f"run-{drop}"
        env = rank_env(out, **extra)
        env.pop(drop, None)
        proc = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and proc.stderr == "" and not (out / "steps").exists(), (drop, proc.stderr)


def test_torch_is_not_imported_by_the_instruments(tmp_path):
    (tmp_path / "plain.py").write_text("import sys; print('torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "plain.py"], cwd=tmp_path, env=rank_env(tmp_path / "run"),
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False" and proc.stderr == "", proc.stderr
    assert (tmp_path / "run" / "steps").is_dir()  # installed all the same: the clock made its folder


def test_another_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['MINE'] = 'ran'\n")
    (tmp_path / "p.py").write_text("import os; print(os.environ.get('MINE'))\n")
    env = rank_env(tmp_path / "run")
    env["PYTHONPATH"] += os.pathsep + str(site)
    proc = subprocess.run([sys.executable, "p.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ran", proc.stderr


def test_log_is_a_no_op_outside_the_cluster_and_checks_its_arguments(tmp_path, monkeypatch):
    import simcluster

    monkeypatch.delenv("SIMCLUSTER_OUTPUT_DIR", raising=False)
    simcluster.log(step=1, loss=1.0)  # nothing to write to, nothing raised
    simcluster.step()
    monkeypatch.setenv("SIMCLUSTER_OUTPUT_DIR", str(tmp_path))
    with pytest.raises(TypeError, match="step must be a positive int, got 0"):
        simcluster.log(step=0, loss=1.0)
    with pytest.raises(TypeError, match="metric note=.* is not a JSON value"):
        simcluster.log(step=1, note=object())
    simcluster.log(step=1, loss=float("nan"))
    simcluster.log(step=1, lr=0.1)  # another rank's row of the same step: merged by the readers
    assert records(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": "nan"}, {"step": 1, "lr": 0.1}]
    assert step_rows(str(tmp_path)) == [{"step": 1, "loss": "nan", "lr": 0.1}]


def test_steps_tail_gives_each_step_once_with_the_total(tmp_path):
    (tmp_path / "steps").mkdir()
    with open(tmp_path / "steps" / "rank-0.jsonl", "w") as fh:
        fh.write('{"step": 1, "step_time_s": 0.5}\n{"step": 2, "step_time_s": 0.4}\n')
    tail = StepsTail(str(tmp_path), total_steps=4)
    assert [(r["step"], r["total_steps"]) for r in tail.rows()] == [(1, 4), (2, 4)]
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        fh.write('{"step": 2, "loss": 3.0}\n{"step": 3, "loss": 2.0}\n')
    assert [(r["step"], r["loss"]) for r in tail.rows()] == [(3, 2.0)] and tail.rows() == []


def generate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "generate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("target, file", [("compose", "c.yml"), ("swarm", "s.yml")])
def test_generated_files_carry_the_instruments(tmp_path, target, file):
    out = tmp_path / file
    proc = generate(tmp_path, "--target", target, "--mesh", "2x2x2", "--script", str(ROOT / "examples" / "ddp.py"),
                    "--traffic", "1", "--trace-steps", "2,3", "--total-steps", "5", "--no-cpu-bridges",
                    "--no-simulated-gpus", "--out", str(out), "--", "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    env = yaml.safe_load(text)["services"]["node-1"]["environment"]
    env = dict(e.split("=", 1) for e in env) if isinstance(env, list) else env
    assert {k: env[k] for k in env if k.startswith(("SIMCLUSTER_TR", "SIMCLUSTER_TO", "SIMCLUSTER_CPU", "SIMCLUSTER_SIM"))} == \
        {"SIMCLUSTER_TRAFFIC": "1", "SIMCLUSTER_TRACE_STEPS": "2,3", "SIMCLUSTER_TOTAL_STEPS": "5",
         "SIMCLUSTER_CPU_BRIDGES": "0", "SIMCLUSTER_SIMULATED_GPUS": "0"}
    regenerate = text.splitlines()[1]  # the header's regenerate line gives every instrument flag back
    assert all(f in regenerate for f in ("--trace-steps 2,3", "--traffic 1", "--total-steps 5", "--no-cpu-bridges",
                                         "--no-simulated-gpus"))


@pytest.mark.parametrize("args, problem", [
    (["--total-steps", "3"], "--total-steps 3: an option of your own code's runs; the built-in trainer takes --steps N"),
    (["--script", "examples/ddp.py", "--traffic", "2"], "--traffic: 0 or 1, got 2"),
    (["--script", "examples/ddp.py", "--total-steps", "3", "--trace-steps", "4"],
     "trace_steps: '4' in '4' lies outside the run's steps 1..3"),
    (["--script", "examples/ddp.py", "--total-steps", "0"], "total_steps: must be >= 1 and <= 10000000 (an int), got 0; e.g. total_steps=5 (--total-steps 5)"),
    (["--script", "examples/ddp.py", "--steps", "3"], "--steps: options of the built-in trainer, not of your code"),
])
def test_instrument_flags_refused_with_the_fix(tmp_path, args, problem):
    out = tmp_path / "x.yml"
    proc = generate(tmp_path, "--nodes" if "--script" in args else "--mesh", *(["1", "--nproc-per-node", "1"]
                    if "--script" in args else ["1x1x1"]), *args, "--out", str(out))
    assert proc.returncode == 2 and problem in proc.stderr and not out.exists(), proc.stderr


BRIDGE_CHECK = '''
import torch, torch.distributed.tensor
from simcluster.launcher.instrument.bridges import has_strategy
import torch._functorch.partitioners as partitioners
print("bridged", has_strategy(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default),
      hasattr(partitioners.functionalize_rng_ops, "__simulated__"), flush=True)  # the compile_rng bridge too
'''


@pytest.mark.parametrize("flag, bridged", [({}, True), ({"SIMCLUSTER_CPU_BRIDGES": "0"}, False)])
def test_cpu_bridges_are_on_in_a_rank_unless_turned_off(tmp_path, flag, bridged):
    (tmp_path / "b.py").write_text(BRIDGE_CHECK)
    proc = subprocess.run([sys.executable, "b.py"], cwd=tmp_path, env=rank_env(tmp_path / "run", **flag),
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == f"bridged {bridged} {bridged}" and proc.stderr == "", proc.stdout + proc.stderr


def test_report_merges_the_trace_of_a_run_started_without_up(tmp_path):
    """A traced run of the user's code started with plain `docker compose up` leaves only the ranks'
    trace/rank-R-step-S.json: `launcher report` merges them into trace.json and draws the timeline."""
    from simcluster.launcher.observe.report import make_report

    (tmp_path / "s.py").write_text(SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, env=rank_env(out, SIMCLUSTER_TRACE_STEPS="2"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # kineto's USDT lines silenced too
    assert os.listdir(out / "trace") == ["rank-0-step-2.json"] and not (out / "trace.json").exists()
    page, pngs = make_report(str(out))
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert {e["args"]["step"] for e in events if e.get("ph") == "X"} == {2}
    assert any(e["name"].startswith("Optimizer.step") for e in events)
    assert str(out / "report" / "timeline.png") in pngs and os.path.isfile(page)


def test_each_ranks_collectives_are_counted_at_its_end(tmp_path):
    """instrument/work.py: gloo's per-group sequence numbers, read before destroy_process_group (which
    empties them) and at the end; a program without torch.distributed counts 0 (the summary's NO WORK)."""
    (tmp_path / "c.py").write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "t = torch.ones(2)\ndist.all_reduce(t)\ndist.broadcast(t, 0)\ng = dist.new_group([0])\ndist.all_reduce(t, group=g)\n"
        "dist.destroy_process_group()\n")
    (tmp_path / "none.py").write_text("print('no gpu, exiting')\n")
    for script, count in (("c.py", 3), ("none.py", 0)):
        out = tmp_path / f"run-{script}"
        proc = subprocess.run([sys.executable, script], cwd=tmp_path, env=rank_env(out), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert records(out / "steps" / "rank-0.work.json") == [{"collectives": count}], script
