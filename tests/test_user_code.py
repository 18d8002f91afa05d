"""Your own code on the cluster: scripts and modules from outside the repo, on real containers.

    python -m pytest -q tests/test_user_code.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_user_code.py    # fails instead

Each test runs ``python -m launcher up`` as a user would, with the examples copied to a folder
outside the repository, their instruments on (--traffic 1 --trace-steps 2): torch pipelining's
example on 2x2x2 and DDP on 2 nodes x 2 ranks (under Compose v1), each equal to one process
(DDP's run also ends quietly: conftest.assert_ends_quietly, what a successful run must not print);
llama_2d (SDPA on DTensors, bridged) on 2 x 2; a module of the user's own that raises on one
rank (the environment contract, the summary naming the rank); and a slow script logging through
simcluster.log whose node is killed (named, then restarted by --max-restarts, resuming from its
own files). The hand-written 3D script's 2x2x2 run is tests/test_compare.py's. Needs the image
simcluster/trainer (bash images/build.sh) and torch on the host. About 6 minutes on a quiet
2-core machine.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import warm
from conftest import COMPOSE_V1, assert_ends_quietly, compose_env, need_torch, noise
from simcluster.launcher.docker.handle import Handle

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]


def up(run_dir: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "up", "--run-dir", str(run_dir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def left_over(run_dir: Path) -> str:
    project = Handle.for_run(str(run_dir)).project
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
                          capture_output=True, text=True).stdout.strip()


def instrumented(run: Path, world: int, steps: int, out: str) -> dict:  # tests/test_compare.py too
    """What the instruments recorded (--traffic 1 --trace-steps 2): every rank's step records for
    every step, the traffic totals per step, and the merged trace's tracks (one per rank)."""
    from simcluster.core.rundir import traffic_totals

    for r in range(world):
        recs = [json.loads(line) for line in (run / "steps" / f"rank-{r}.jsonl").read_text().splitlines()]
        assert [x["step"] for x in recs] == list(range(1, steps + 1)), (r, recs)
        assert all(x["step_time_s"] > 0 and x["rss_mb"] > 50 for x in recs), recs
    trace = json.loads((run / "trace.json").read_text())["traceEvents"]
    tracks = {e["tid"] for e in trace if e.get("ph") == "X" and e["tid"] < 1000}
    assert tracks == set(range(world)), tracks
    assert {e["args"]["step"] for e in trace if e.get("ph") == "X"} == {2}
    assert re.search(rf"^launcher\s*\| progress: step {steps}/{steps} \(100%\)", out, re.M), out[-3000:]
    assert f"trace        {run}/trace.json" in out and "traffic/step" in out, out[-3000:]
    return traffic_totals(str(run))


def pipeline_bytes(dp: int, tp: int, batch: int, microbatches: int, dim: int) -> int:
    """The closed form of one step's pipeline bytes on one link between two stages (float32): every
    (dp, tp) rank of a stage sends one (batch/dp/microbatches, dim) tensor per microbatch."""
    return dp * tp * microbatches * (batch // dp // microbatches) * dim * 4


def losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def one_process(script: Path, out: Path, *args: str) -> list[float]:
    """The same script run in one plain process on the host (the reference: ``python SCRIPT``,
    forked from the worker's warm interpreter, tests/warm.py)."""
    need_torch()
    proc = warm.run(str(script), ["--out-dir", str(out), *args], cwd=os.getcwd(), script=True, timeout=300,
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return losses(out)


def test_torch_pipelining_example_on_2x2x2(tmp_path):
    """examples/pipelining.py (PipelineStage + Schedule1F1B over the pp group, 4 microbatches: an
    order GPipe does not take), unchanged, on two containers: its loss equals one process's at
    every step, and its instruments record the schedule's p2p as pp traffic whose bytes per link
    are the closed form."""
    script = tmp_path / "mycode" / "pipelining.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "examples" / "pipelining.py", script)
    run = tmp_path / "pipe"
    args = ("--steps", "4", "--schedule", "1f1b", "--microbatches", "4")
    proc = up(run, "--mesh", "2x2x2", "--traffic", "1", "--trace-steps", "2", "--script", str(script), "--", *args)
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
    traffic = instrumented(run, 8, 4, out)
    closed = pipeline_bytes(dp=2, tp=2, batch=16, microbatches=4, dim=32)
    for step in range(2, 5):
        links, kinds = traffic[step]["links"], traffic[step]["bytes"]
        assert links["0->1"] == links["1->0"] == closed and kinds["pp_send"] == 2 * closed, traffic[step]
    ref = one_process(script, tmp_path / "ref", *args)
    got = losses(run)
    assert len(got) == 4 and all(abs(m - r) <= 1e-5 * abs(r) for m, r in zip(got, ref)), (got, ref)
    assert left_over(run) == ""


def test_llama_2d_with_sdpa_on_dtensors_on_2_nodes_x_2_ranks(tmp_path):
    """examples/llama_2d.py, written for GPUs (device from torch.accelerator, SDPA on DTensors):
    on 2 nodes x 2 ranks (dp across the nodes, tp inside) it runs only because the ranks bridge
    the CPU attention op (launcher/instrument/bridges.py), and its loss equals one process's."""
    data = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    assert data.is_file(), f"{data} missing: the real text the tests read"
    script = tmp_path / "mycode" / "llama.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "examples" / "llama_2d.py", script)
    run = tmp_path / "llama"
    proc = up(run, "--nodes", "2", "--nproc-per-node", "2", "--mount", f"{data}:/data/text.txt", "--script",
              str(script), "--", "--steps", "3", "--data", "/data/text.txt")
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
    assert not noise(out), noise(out)
    ref = one_process(script, tmp_path / "ref", "--steps", "3", "--data", str(data))
    got = losses(run)
    assert len(got) == 3 and all(abs(m - r) <= 1e-5 * abs(r) for m, r in zip(got, ref)), (got, ref)
    assert left_over(run) == ""


def test_ddp_script_on_2_nodes_x_2_ranks(tmp_path):
    script = tmp_path / "mycode" / "ddp_copy.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "examples" / "ddp.py", script)
    run = tmp_path / "ddp"
    proc = up(run, "--nodes", "2", "--nproc-per-node", "2", "--traffic", "1", "--trace-steps", "2",
              "--total-steps", "4", "--script", str(script), "--", "--steps", "4",
              env=compose_env(COMPOSE_V1))  # the instruments under Compose v1 (the other tests: v2)
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
    assert_ends_quietly(out + proc.stderr, run)
    assert left_over(run) == ""
    traffic = instrumented(run, 4, 4, out)
    params = 16 * 64 + 64 + 64 + 1  # ddp.py's MLP: DDP all-reduces every gradient once a step
    for step in range(2, 5):  # + the 4-byte loss all-reduce of the step before
        kinds = traffic[step]["bytes"]  # and DDP's broadcast of module buffers before each forward
        assert kinds["world_all_reduce"] == 4 * (4 * params + 4) and set(kinds) <= {"world_all_reduce",
                                                                                   "world_broadcast"}, traffic[step]
        assert traffic[step]["links"] == {"span": sum(kinds.values())}, traffic[step]
    for r in range(4):
        assert re.search(rf"^node-{r // 2} r{r}\s*\| ddp rank={r} local_rank={r % 2} world_size=4 host=node-{r // 2} "
                         rf"node={r // 2}$", out, re.M), out[-3000:]
    ref = one_process(script, tmp_path / "ref", "--steps", "4")
    got = losses(run)
    assert len(got) == 4 and all(abs(m - r) <= 1e-5 * abs(r) for m, r in zip(got, ref)), (got, ref)
    summary = out.split("== summary: OK ==", 1)[1]  # only the rows whose value is known
    assert re.search(r"^  final loss   [\d.]+ after 4 steps$", summary, re.M), summary
    assert "rank output  4/4 ranks printed" in summary and "tokens/s" not in summary and "?" not in summary, summary


ENVCHECK = '''
import os, sys
import torch.distributed as dist
import train  # the user's own package of that name, not the image's
dist.init_process_group("gloo")
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "SIMCLUSTER_NODE",
        "SIMCLUSTER_NNODES", "SIMCLUSTER_OUTPUT_DIR", "SIMCLUSTER_RESTART_COUNT", "OMP_NUM_THREADS",
        "GLOO_SOCKET_IFNAME", "TORCHELASTIC_RESTART_COUNT")
print("env " + " ".join(f"{k}={os.environ.get(k)}" for k in keys) + f" cwd={os.getcwd()} train={train.__file__}"
      + f" args={sys.argv[1:]}", flush=True)
with open(f"seen-{dist.get_rank()}.txt", "w") as fh:  # a relative write: the shared working directory
    fh.write(open("notes.txt").read())  # a relative read of a file beside the code
dist.barrier()
if dist.get_rank() == 3:
    import deep
    deep.f0()  # raises ValueError 62 frames down (a traceback far longer than 40 lines)
dist.barrier()
'''
DEEP = "".join(f"def f{i}():\n    return f{i + 1}()\n\n\n" for i in range(60)) + \
    "def f60():\n    raise ValueError(\"boom on rank 3\")\n"


def test_failing_module_names_rank_and_traceback(tmp_path):
    """--module from --code: torchrun's and the cluster's environment, the user's own `train`
    package first on sys.path; rank 3 raises 62 frames deep: up exits non-zero naming node-1,
    rank 3, the error and its last frames; no metrics: no '?' row; nothing is left running."""
    code = tmp_path / "code"
    (code / "train").mkdir(parents=True)
    (code / "train" / "__init__.py").write_text("")
    (code / "envcheck.py").write_text(ENVCHECK)
    (code / "deep.py").write_text(DEEP)
    (code / "notes.txt").write_text("beside the code\n")
    before = sorted(p.name for p in code.iterdir())
    run = tmp_path / "fail"
    proc = up(run, "--nodes", "2", "--nproc-per-node", "2", "--code", str(code), "--module", "envcheck",
              "--timeout-s", "20", "--", "--flag", "x")
    out = proc.stdout
    assert proc.returncode == 1, out[-5000:] + proc.stderr[-2000:]
    for r in range(4):
        k = r // 2
        expected = (f"env RANK={r} LOCAL_RANK={r % 2} WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK={k} "
                    f"MASTER_ADDR=node-0 SIMCLUSTER_NODE={k} SIMCLUSTER_NNODES=2 SIMCLUSTER_OUTPUT_DIR=/runs/fail "
                    f"SIMCLUSTER_RESTART_COUNT=0 OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 "
                    f"TORCHELASTIC_RESTART_COUNT=0 cwd=/runs/fail/work train=/runs/fail/work/train/__init__.py "
                    f"args=['--flag', 'x']")
        assert expected in out, out[-4000:]
        # the working directory is the run folder's work/, shared by both nodes, the code's files linked in
        assert (run / "work" / f"seen-{r}.txt").read_text() == "beside the code\n"
    assert sorted(p.name for p in code.iterdir()) == before  # the user's folder is never written
    assert sorted(p.name for p in (run / "code").iterdir()) == before  # the run folder keeps the code that ran
    assert (run / "code" / "deep.py").read_text() == DEEP
    assert "== summary: FAILED ==" in out
    summary = out.split("== summary: FAILED ==", 1)[1]
    earlier = re.search(r"FAILED rank 3 on node-1: ValueError: boom on rank 3\n {6}\.\.\. (\d+) earlier frames\n",
                        summary)
    assert earlier and int(earlier.group(1)) >= 60, summary  # f0..f58 and the module's (runpy's too, with -m)
    assert 'File "/runs/fail/work/deep.py", line 242, in f60\n          raise ValueError("boom on rank 3")' in summary, summary
    rows = summary.split("\n  node-0")[0]  # the rows above the nodes' (exception lines may hold a '?')
    assert "metrics      none: the job made no optimizer step and wrote no metrics.jsonl" in rows, summary
    assert "?" not in rows, summary
    assert left_over(run) == ""


SLOW = '''
import json, os, sys, time
import torch, torch.distributed as dist
import simcluster  # the logging API: no optimizer here, so the script marks its own steps
dist.init_process_group("gloo")
out, total = os.environ["SIMCLUSTER_OUTPUT_DIR"], int(sys.argv[1])
state = os.path.join(out, "state.json")
start = json.load(open(state))["step"] if os.path.exists(state) else 0  # resume from its own files
for step in range(start + 1, total + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.5)
    simcluster.step()
    if dist.get_rank() == 0:
        simcluster.log(step, total_steps=total, loss=torch.tensor(1.0 / step),
                       restart=int(os.environ["SIMCLUSTER_RESTART_COUNT"]))
        with open(state + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(state + ".tmp", state)
dist.destroy_process_group()
'''


def test_killed_node_is_named_then_restart_resumes(tmp_path):
    script = tmp_path / "mycode" / "slow.py"
    script.parent.mkdir()
    script.write_text(SLOW)
    run = tmp_path / "slow"
    cmd = [sys.executable, "-m", "launcher", "up", "--run-dir", str(run), "--nodes", "2", "--nproc-per-node", "1",
           "--script", str(script), "--timeout-s", "20", "--max-restarts", "1", "--", "20"]
    with open(tmp_path / "up.out", "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, text=True)
        chaos = subprocess.run([sys.executable, "-m", "launcher", "chaos", "--kill", "node-1", "--at-step", "4",
                                "--run-dir", str(run), "--wait-s", "300"], cwd=ROOT, capture_output=True, text=True,
                               timeout=400)
        code = proc.wait(timeout=600)
    out = (tmp_path / "up.out").read_text()
    assert chaos.returncode == 0, chaos.stdout + chaos.stderr + out[-3000:]
    assert "LOST         node-1 (ranks 1): no heartbeat" in out, out[-4000:]
    assert "restart 1/1" in out and code == 0, out[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21))  # each step once: it resumed where it was
    assert {r["restart"] for r in rows} == {0, 1} and rows[-1]["restart"] == 1
    assert all(isinstance(r["loss"], float) for r in rows)  # simcluster.log turned the tensor into a float
    marks = [json.loads(line) for line in (run / "steps" / "rank-0.jsonl").read_text().splitlines()]
    assert {m["restart"] for m in marks} == {0, 1} and marks[0]["step"] == 1, marks  # simcluster.step's records
    assert left_over(run) == ""


def test_image_without_torch_is_refused_before_the_nodes_start(tmp_path):
    base = next((b for b in ("simcluster/base:bookworm", "python:3.11-slim")
                 if subprocess.run(["docker", "image", "inspect", b], capture_output=True).returncode == 0), None)
    assert base, "no base image to build a torch-less image from: bash images/build.sh"
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN ln -sf /usr/bin/python3 /usr/local/bin/python\n")
    subprocess.run(["docker", "build", "-q", "-t", "simcluster/test-notorch:latest", str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    run = tmp_path / "notorch"
    proc = up(run, "--nodes", "1", "--nproc-per-node", "1", "--script", str(ROOT / "examples" / "ddp.py"),
              "--image", "simcluster/test-notorch:latest", timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "image: simcluster/test-notorch:latest: cannot import torch, simcluster.launcher.container.node" in proc.stderr
    assert "FROM simcluster/trainer:latest" in proc.stderr
    assert left_over(run) == "" and not (run / "compose.yml").exists()
