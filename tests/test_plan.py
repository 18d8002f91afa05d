"""The planner against what the trainer does: traffic per kind and link and the bytes each rank holds
equal exactly, peak activations within 10% of torch's MemTracker; the bubble; `launcher plan`.

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_plan.py

Measured without Docker or gloo: each rank of the real trainer runs alone on torch's fake process
group, forked (train/plan/measure.py), with the traffic accounting on, tiny model, 2 steps (step 1
carries the schedule's warm-up vote; step 2 is compared).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

if os.environ.get("CI", "").lower() == "true":
    import torch  # under CI=true a missing torch fails this module (conftest's rule), it is not skipped
else:
    torch = pytest.importorskip("torch")

from simcluster.launcher.cli import main  # noqa: E402
from simcluster.core.config import Config, SCHEDULES  # noqa: E402
from simcluster.train.plan.measure import measure_ranks  # noqa: E402
from simcluster.train.plan.predict import plan  # noqa: E402
from simcluster.train.plan.schedule import rank_orders, shared_window, simulate  # noqa: E402
from simcluster.train.plan.shapes import state_bytes  # noqa: E402
from simcluster.train.plan.traffic import rank_traffic  # noqa: E402
from simcluster.train.preflight import preflight  # noqa: E402
from simcluster.core.timeline import textbook_bubble  # noqa: E402

PARITY_MESHES = ["1x1x1", "1x1x2", "1x2x1", "2x1x1", "1x2x2", "2x1x2", "2x2x1", "2x2x2", "4x1x2"]  # tests/test_parity.py
HELD = ("params", "grads", "optimizer")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    return str(path)


def tiny(corpus: str, run_dir: Path, mesh: str, schedule: str, **kw):
    return preflight(Config(model="tiny", mesh=mesh, schedule=schedule, microbatches=4, steps=2, val_every=0,
                            traffic=1, data=corpus, run_dir=str(run_dir), **kw))


def check_traffic_and_held(run, ranks=None) -> None:
    for got in measure_ranks(run, ranks):
        step2 = {k: v for k, v in got["traffic"][-1].items() if k != "step"}
        assert step2 == rank_traffic(run, got["rank"]), (str(run.mesh), run.config.schedule, got["rank"])
        want = state_bytes(run, got["rank"])
        assert got["held"] == {k: want[k] for k in HELD}, got["rank"]


def corner_ranks(run) -> list[int]:
    """Each node's first rank on even nodes, its last on odd ones (and both on a one-node mesh): every
    stage, both ends of the dp and tp coordinates."""
    per = run.mesh.ranks_per_node
    ranks = {k * per + (per - 1 if k % 2 else 0) for k in range(run.mesh.pp)}
    return sorted(ranks | ({per - 1} if run.mesh.pp == 1 else set()))


@pytest.mark.parametrize("mesh", PARITY_MESHES)
def test_1f1b_traffic_and_held_bytes_equal_on_the_parity_meshes(corpus, tmp_path, mesh):
    """Every rank of 2x2x2; the corner ranks of the others."""
    run = tiny(corpus, tmp_path, mesh, "1f1b")
    check_traffic_and_held(run, None if mesh == "2x2x2" else corner_ranks(run))


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "1f1b"])
def test_every_schedule_on_2x2x2_traffic_equals(corpus, tmp_path, schedule):
    """Both nodes, every stage: rank 0 (pp0/dp0/tp0) and rank 7 (pp1/dp1/tp1)."""
    run = tiny(corpus, tmp_path, "2x2x2", schedule)
    check_traffic_and_held(run, corner_ranks(run))


# MemTracker cannot follow the split backward of interleaved-zb, zbv and dualpipev (torch 2.13:
# "A leaf node was passed to _will_engine_execute_node but we are currently running autograd.grad()").
@pytest.mark.parametrize("mesh,schedule", [("2x2x2", "1f1b"), ("2x1x1", "interleaved-1f1b")])
def test_peak_activations_within_10_percent_of_memtracker(corpus, tmp_path, mesh, schedule):
    run = tiny(corpus, tmp_path, mesh, schedule)
    predicted = {r.rank: r for r in plan(run).ranks}
    last = run.mesh.world_size - 1
    for got in measure_ranks(run, [0, last], memory=True):
        mine, mem = predicted[got["rank"]], got["memory"]
        assert abs(mine.activations / mem["ACT"] - 1) < 0.10, (got["rank"], mine.activations, mem)
        assert mine.params + mine.gathered == mem["PARAM"] and mine.optimizer == mem["OPT"], (got["rank"], mem)


def test_bubble_of_torchs_order_is_the_textbook_on_a_uniform_clock():
    """Backward = 2 forwards, every stage alike: gpipe and 1f1b give (p-1)/(m+p-1) exactly."""
    for schedule in ("gpipe", "1f1b"):
        for p, m in ((2, 2), (2, 4), (4, 4), (4, 8)):
            durations = {(k, s): {"F": 1, "B": 2}[k] for k in "FB" for s in range(p)}
            got = simulate(rank_orders(schedule, p, m, 1), durations).bubble
            assert got == pytest.approx(textbook_bubble(schedule, p, m), abs=1e-12), (schedule, p, m)


def test_plan_command_table_json_and_bad_input(capsys):
    """In this process (cli.main): a subprocess would import torch again."""
    assert main(["plan", "--mesh", "2x2x2", "--model", "tiny", "--schedule", "1f1b", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "plan 2x2x2" in out and len([l for l in out.splitlines() if l[:4].strip().isdigit()]) == 8
    assert "bubble " in out and "textbook (p-1)/(m+p-1) 0.200" in out
    assert main(["plan", "--mesh", "2x1x2", "--model", "tiny", "--n-layers", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shape"]["n_layers"] == 4 and len(data["ranks"]) == 4
    assert data["ranks"][0]["traffic"]["messages"]["tp_all_reduce"] == 4 * 2 * 2  # 4 a block, 2 blocks, 2 microbatches
    for args, message in ((["--mesh", "2x2x3", "--model", "tiny"], "n_heads=4 is not divisible by tp=3"),
                          (["--mesh", "2x2"], "mesh: cannot parse '2x2'"),
                          (["--mesh", "2x1x1", "--microbatches", "1"], "microbatches=1 < pipeline stages=2")):
        assert main(["plan", *args]) == 2
        err = capsys.readouterr().err
        assert "preflight failed" in err and message in err, err


def test_recalibrate_measures_again_and_replaces_the_cache(tmp_path, monkeypatch):
    """--recalibrate measures even over a valid cache and writes what it measured; without it the
    cache is read. The measurement is stubbed here: the real one (about 30 s) runs once a session,
    for the first test that asks for "local"."""
    from simcluster.train.plan import lookup as hw_module
    from simcluster.core.hardware import HARDWARE

    monkeypatch.setenv("SIMCLUSTER_CACHE", str(tmp_path))
    measured = [HARDWARE["h100-sxm-8x"], HARDWARE["a100-80g-8x"]]
    calls = []
    monkeypatch.setattr(hw_module, "calibrate", lambda: calls.append(1) or measured[len(calls) - 1])
    first = hw_module.hardware("local")
    assert first == measured[0] and hw_module.hardware("local") == measured[0] and len(calls) == 1
    assert hw_module.hardware("local", recalibrate=True) == measured[1] and len(calls) == 2
    assert hw_module._cached(hw_module.cache_path()) == measured[1] and hw_module.cache_path().startswith(str(tmp_path))


def test_hardware_models_step_time_and_search(capsys, tmp_path):
    """Named targets carry their sources; `local` is read from its cache file; the step time's parts
    add up and H100 beats A100; the search ranks runnable candidates only, fastest first."""
    from simcluster.core.hardware import HARDWARE, memory_of_rank
    from simcluster.train.plan.lookup import _cached, cache_path, hardware
    from simcluster.train.plan.search import search
    from simcluster.train.plan.steptime import step_time

    for hw in HARDWARE.values():
        assert hw.sources and all(hw.sources) and 0 < hw.flops < hw.bf16_flops
    local = hardware("local")  # measured into the session's cache (conftest) by the first test that asks, under its
    # lock (about 30 s and 40 core-s here); test_traffic's acceptance run may have asked first: then read, not measured
    assert local.flops > 1e8 and local.intra_bw > 1e6 and 0 < local.latency_s < 1 and local.shared_cores >= 1
    assert Path(cache_path()).is_file() and hardware("local") == local  # read back, not measured again
    assert 0 < local.shared_flops and local.shared_latency_s > 0
    from simcluster.train.plan.steptime import INSIDE
    assert {(kind, k) for kind, k, *_ in local.collective_cpu} >= {(kind, k) for kind in INSIDE for k in (2, 4)}
    assert all(a >= 0 and b >= 0 and a + b > 0 for *_, a, b in local.collective_cpu), local.collective_cpu
    assert _cached(cache_path()) == local
    other = tmp_path / "hardware-local.json"  # not the session's file: other workers read that one
    other.write_text('{"name": "local", "flops": 1}')  # another version's shape: measured again
    assert _cached(str(other)) is None
    other.write_text('{"name": "lo')  # a torn file: the same
    assert _cached(str(other)) is None
    other.write_text(json.dumps(dataclasses.asdict(local)))
    assert _cached(str(other)) == local
    one = plan(preflight(Config(model="tiny", mesh="1x1x1")))
    alone = step_time(one, local)[0]  # one rank, a core to itself: its FLOPs at the one-core rate
    assert alone.compute == pytest.approx(one.ranks[0].flops / local.flops) and alone.bubble == 0
    st, stages = step_time(plan(preflight(Config(model="tiny", mesh="2x2x2"))), local)
    assert [s.rank for s in stages] == [0, 4] and st.total == pytest.approx(st.compute + st.communication + st.bubble
                                                                              + st.optimizer) and st.bubble > 0
    p = plan(preflight(Config(model="tiny", mesh="2x2x2")))
    h100, a100 = step_time(p, HARDWARE["h100-sxm-8x"])[0], step_time(p, HARDWARE["a100-80g-8x"])[0]
    assert h100.total == pytest.approx(h100.compute + h100.communication + h100.bubble + h100.optimizer)
    assert 0 < h100.total < a100.total and h100.bubble > 0
    found, refused = search(Config(model="tiny"), 2, HARDWARE["h100-sxm-8x"], memory_per_rank=1e12)
    assert found and [c.step.total for c in found] == sorted(c.step.total for c in found) and all(c.fits for c in found)
    assert {c.mesh for c in found} == {"1x1x2", "1x2x1", "2x1x1"} and all(refused.values())
    assert {"2x1x1 1f1b", "2x1x1 zbv"} <= {f"{c.mesh} {c.schedule}" for c in found}
    tight, _ = search(Config(model="tiny", schedule="1f1b"), 2, HARDWARE["h100-sxm-8x"], memory_per_rank=1e6)
    assert tight and not any(c.fits for c in tight)  # a tiny rank holds ~10 MB: none fits 1 MB
    assert memory_of_rank(HARDWARE["h100-sxm-8x"], 8) == 80e9 and memory_of_rank(local, 8) == local.memory / 8
    assert main(["plan", "--mesh", "2x2x2", "--model", "tiny", "--hardware", "nvl72"]) == 2
    assert "choose one of h100-sxm-8x, a100-80g-8x, h100-96g, h200, local" in capsys.readouterr().err
    assert main(["plan", "--search", "--world-size", "8", "--mesh", "2x2x2"]) == 2
    assert "drop --mesh" in capsys.readouterr().err


def test_collective_cpu_scales_the_measured_line_to_the_group_and_prices_the_copying():
    """A group size between measured ones takes the line of the largest below it, per call by
    (k - 1) / (k' - 1) and per byte by the ring's bytes; the copying is the communication's CPU."""
    from simcluster.core.hardware import Hardware
    from simcluster.train.plan.steptime import collective_cpu_s, step_time

    table = (("tp_all_reduce", 2, 1e-3, 1e-9), ("tp_all_reduce", 4, 2e-3, 3e-9), ("fsdp_all_gather", 2, 0.0, 2e-9))
    hw = Hardware("t", 1e10, 1e10, 10 ** 10, 1e10, 1e9, 1e9, 1e-4, 0, ("made up",), shared_cores=2,
                  node_link=True, shared_latency_s=1e-3, shared_flops=1e10, collective_cpu=table)
    assert collective_cpu_s("tp_all_reduce", 2, 10, 10 ** 6, hw) == pytest.approx(10e-3 + 1e-3)
    assert collective_cpu_s("tp_all_reduce", 4, 10, 10 ** 6, hw) == pytest.approx(20e-3 + 3e-3)
    # 8 ranks from the line at 4: per call x 7/3, per byte x (2 * 7/8) / (2 * 3/4)
    assert collective_cpu_s("tp_all_reduce", 8, 3, 10 ** 6, hw) == pytest.approx(3 * 2e-3 * 7 / 3 + 3e-3 * 7 / 6)
    assert collective_cpu_s("fsdp_all_gather", 3, 1, 10 ** 6, hw) == pytest.approx(2e-3 * 2)  # (k - 1) shards
    # no line of a kind: twice the ring's bytes at the node's bandwidth
    assert collective_cpu_s("fsdp_reduce_scatter", 2, 1, 10 ** 6, hw) == pytest.approx(2 * 0.5 * 10 ** 6 / 1e9)
    p = plan(preflight(Config(model="tiny", mesh="1x1x2")))
    cheap, dear = (step_time(p, dataclasses.replace(hw, collective_cpu=(("tp_all_reduce", 2, 0.0, b),)))[0]
                   for b in (1e-10, 1e-8))
    nbytes = p.ranks[0].traffic["bytes"]["tp_all_reduce"]
    # 2 ranks on 2 cores: the copying adds its CPU to the step, reported as communication
    assert dear.communication - cheap.communication == pytest.approx(nbytes * (1e-8 - 1e-10), rel=1e-6)
    assert dear.compute == pytest.approx(cheap.compute)


def test_local_overhead_is_measured_per_stage_and_scales_the_step(corpus, tmp_path, capsys):
    """On `local` each pp stage's CPU is measured on the fake group (the tiny model's ops are mostly
    not FLOPs: far above 1x its FLOP time), with denormals flushed (the fake receives' garbage made a
    later stage 5x slower than the first), and it multiplies the stage's compute; `plan` prints it."""
    from simcluster.train.plan.lookup import hardware
    from simcluster.train.plan.measure import stage_overhead
    from simcluster.train.plan.steptime import step_time

    local = hardware("local")
    run = tiny(corpus, tmp_path, "2x2x2", "1f1b")
    overhead = stage_overhead(plan(run), local.flops, local.shared_cores)
    # above 1x (2-3x on a quiet machine; the calibrated FLOP rate and this measure can meet different loads)
    assert len(overhead) == 2 and min(overhead) > 1.0 and max(overhead) < 3 * min(overhead), overhead
    p = plan(run)  # the rule, not a load's ratio: the step's compute grows with the measured overhead
    once, twice = step_time(p, local, overhead)[0], step_time(p, local, tuple(2 * o for o in overhead))[0]
    assert twice.compute > 1.5 * once.compute and twice.total > once.total, (once, twice)
    assert main(["plan", "--mesh", "2x2x2", "--model", "tiny", "--data", corpus, "--hardware", "local"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"measured on the fake process group, as many ranks at once as the job has: x[\d.]+, x[\d.]+ its FLOPs", out), out


IDLE_GROUPS = """
import os, sys, time, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from simcluster.train.plan.measure import idle_gloo_groups
shape = tuple(map(int, sys.argv[1].split("x")))
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=shape[0] * shape[1] * shape[2])
mesh = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
def woken():
    return sum(int(line.split()[1]) for t in os.listdir("/proc/self/task")
               for line in open(f"/proc/self/task/{t}/status") if line.startswith("voluntary_ctxt"))
groups = idle_gloo_groups(mesh)
before = woken(); time.sleep(0.5)
print(len(groups), woken() - before)
"""


def test_the_overhead_children_hold_their_ranks_gloo_groups_idle(tmp_path):
    """Each overhead child holds one idle gloo group a group of its cluster rank (the world's and each
    DeviceMesh dimension's that is not the world), whose event loops wake about every 10 ms."""
    import warm

    got = {}
    probe = tmp_path / "idle_groups.py"
    probe.write_text(IDLE_GROUPS)
    for mesh in ("1x1x1", "2x1x1", "2x2x2"):  # each in a process of its own, forked from a warm one (tests/warm.py)
        out = warm.run(str(probe), [mesh], script=True, timeout=120, cwd=os.getcwd(),
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert out.returncode == 0, out.stderr
        got[mesh] = tuple(map(int, out.stdout.split()))
    assert [n for n, _ in got.values()] == [1, 3, 4], got
    # 4 loops, 0.5 s, about 100 wake-ups a second each: they poll, not block. Counted on a loaded machine
    # (110 of 200 beside a 2x2x2 job and 3 test workers on 2 cores), so the floor is a quarter of that rate
    assert got["2x2x2"][1] >= 4 * 0.5 * 100 * 0.25, got


def test_sends_on_a_link_delay_the_pipeline_as_the_order_says():
    """2 stages, 1f1b, 2 microbatches, F = 1, B = 2, a send 0.5: the critical path gains the
    first activation, the first grad and the last grad (1.5), less the 0.5 the second microbatch's
    activation waits anyway; a send on the same rank (zbv's turn at the last stage) costs nothing."""
    durations = {(k, s): {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}[k] for k in "FBIW" for s in range(4)}
    orders = rank_orders("1f1b", 2, 2, 1)
    assert simulate(orders, durations).window == 9.0
    assert simulate(orders, durations, {a: 0.5 for a in durations}).window == 10.0
    slow = simulate(orders, durations, {a: 4.0 for a in durations})  # sends queue on the sender's link
    assert slow.window == 1 + 4 + 4 + 3 + 4 + 2  # F0; a0, then a1 behind it on stage 0's link; F1+B1; g1; B1
    zbv = rank_orders("zbv", 2, 2, 2)
    assert simulate(zbv, durations, {a: 0.0 for a in durations}).window == simulate(zbv, durations).window
    # on shared cores: as many cores as ranks is the plain clock; one core runs all the work back to back
    none = {a: 0.0 for a in durations}
    assert shared_window(orders, durations, none, {a: 0.5 for a in durations}, 1, 2) == (10.0, [6.0, 6.0])
    assert shared_window(orders, durations, none, None, 1, 1)[0] == 12.0
    assert shared_window(orders, durations, none, None, 2, 2, busy_rate=0.5)[0] == 24.0  # 4 ranks, half speed
    longer = {a: d + 1.0 for a, d in durations.items()}  # a wait of 1 after each action is a longer action
    assert shared_window(orders, durations, {a: 1.0 for a in durations}, None, 1, 2)[0] == simulate(orders, longer).window


def test_memory_per_node_warns_and_strict_memory_refuses(tmp_path, capsys):
    """`generate` preflights a node's predicted tensors against --memory-per-node: a warning naming
    the node and the fix (the file still written), --strict-memory refuses and writes nothing, a
    limit that fits says nothing; user code cannot be predicted and says so."""
    out = tmp_path / "mesh.yml"
    base = ["generate", "--mesh", "2x2x2", "--model", "small", "--out", str(out)]
    assert main([*base, "--memory-per-node", "200m"]) == 0 and out.is_file()
    err = capsys.readouterr().err
    assert err.count("warning: node-") == 2 and "node-0: its 4 ranks' tensors are predicted at 550 MiB > " \
        "--memory-per-node 200m (200 MiB)" in err and "raise --memory-per-node" in err, err
    out.unlink()
    assert main([*base, "--memory-per-node", "200m", "--strict-memory"]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "memory (--strict-memory):" in err and "node-1: its 4 ranks' tensors are predicted at 337 MiB" in err, err
    assert main([*base, "--memory-per-node", "3g", "--strict-memory"]) == 0 and out.is_file()
    assert capsys.readouterr().err == ""
    assert main([*base, "--strict-memory"]) == 2 and "needs the limit to check" in capsys.readouterr().err
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert main(["generate", "--script", str(script), "--nodes", "2", "--nproc-per-node", "1", "--out",
                 str(tmp_path / "u.yml"), "--memory-per-node", "1g", "--strict-memory"]) == 2
    assert "your code's memory is not predicted" in capsys.readouterr().err


def test_project_refuses_folders_without_records(tmp_path, capsys):
    """A missing folder, a folder that is not the trainer's, one without a traced step or traffic:
    each named, with the flags to run with; nothing else is needed to fail fast."""
    from simcluster.core.flags import save_config

    assert main(["project", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["project", str(tmp_path)]) == 2
    assert "has no config.yaml" in capsys.readouterr().err
    save_config(Config(model="tiny", mesh="2x1x1", steps=4), str(tmp_path))
    assert main(["project", str(tmp_path), "--hardware", "h100-sxm-8x"]) == 2
    err = capsys.readouterr().err
    assert "lacks trace.json with a traced step after the first and traffic/rank-R.jsonl of that step" in err
    assert "--traffic 1 --trace-steps" in err
    assert main(["project", str(tmp_path), "--hardware", "tpu"]) == 2
    assert "choose one of h100-sxm-8x, a100-80g-8x, h100-96g, h200, local" in capsys.readouterr().err


def test_the_fake_pass_leaves_a_later_real_run_real(corpus, tmp_path):
    """The planner's fake-tensor pass, then a real run in the same process (as a test process runs
    `plan` and then the reference): what the pass cached (the rope tables) is real, so the run's
    first loss is a number, about ln(256), not a FakeTensor raising DataDependentOutputException."""
    from simcluster.train.model import rope_tables
    from simcluster.train.plan import shapes
    from simcluster.train.reference import run_reference

    run = tiny(corpus, tmp_path / "run", "1x1x1", "1f1b")
    rope_tables.cache_clear()
    shapes._stage_cost.cache_clear()
    assert shapes.stage_cost(run, 0).fwd_flops > 0  # the fake pass first: it fills the rope cache
    losses = [r["loss"] for r in run_reference(run)]
    assert len(losses) == 2 and 5.3 < losses[0] < 5.8, losses
