"""`launcher compare` on real containers: the hand-written 3D script on two meshes agrees step by
step, and a variant whose tp peers get different batch shards is caught at its first bad step.

    python -m pytest -q tests/test_compare.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_compare.py    # fails instead

examples/manual_3d.py, copied to a folder outside the repository, 3 steps: compare 2x2x2 against
2x2x1 with the instruments on (the 2x2x2 run is also tests/test_user_code.py's 3D run: placement,
one-process parity, traffic, trace), and the variant on 1x1x2 against 1x1x1 (the smallest mesh
with tp peers). About 2-3 minutes on this 2-core machine. Needs the image simcluster/trainer
(bash images/build.sh); --mount-code runs this checkout's code.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import noise
from simcluster.launcher.docker.handle import Handle
from test_user_code import instrumented, one_process, pipeline_bytes

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]
ROW = re.compile(r"^ +(\d+) +(\S+) +(\S+) +(\S+)$", re.M)  # step, A, B, rel_diff
SHIFT = "        x, y = x[dp_i * shard:(dp_i + 1) * shard], y[dp_i * shard:(dp_i + 1) * shard]\n"
# from step 2 on, tp rank 1 takes its batch shard one sample later than its tp peer (wrong: peers need one input)
SHIFTED = ('        if step >= 2 and mesh["tp"].get_local_rank() == 1:\n'
           '            x, y = x.roll(-1, 0), y.roll(-1, 0)\n' + SHIFT)


def compare(tmp_path: Path, script: Path, *args: str, a: str = "2x2x2", b: str = "2x2x1"
            ) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher", "compare", "--script", str(script), "--mesh", a,
                           "--against", b, "--mount-code", "--run-dir", str(tmp_path / "runs"), *args, "--",
                           "--steps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return proc, time.monotonic() - t0


def copy_script(tmp_path: Path, text: str | None = None) -> Path:
    script = tmp_path / "mycode" / "train3d.py"
    script.parent.mkdir()
    source = (ROOT / "examples" / "manual_3d.py").read_text()
    if text is not None:
        assert source.count(SHIFT) == 1
        source = source.replace(SHIFT, text)
    script.write_text(source)
    return script


def left_over(run_dir: Path) -> str:
    project = Handle.for_run(str(run_dir)).project
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
                          capture_output=True, text=True).stdout.strip()


def losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_manual_3d_on_2x2x2_agrees_with_2x2x1_and_one_process(tmp_path):
    """rank r runs on node r // 4 (pipeline send/recv r <-> r+4 crosses containers); every step's
    loss equals 2x2x1's and one process's within 1e-5 relative, with the instruments on and the
    script unchanged: progress, every rank's steps, traffic whose pipeline bytes per link are the
    closed form, a trace with one track per rank; the end is quiet."""
    script = copy_script(tmp_path)
    proc, took = compare(tmp_path, script, "--traffic", "1", "--trace-steps", "2")
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
    assert not noise(out), noise(out)
    run = tmp_path / "runs" / "a-mesh-2x2x2"
    log = (run / "cluster.log").read_text()
    places = re.findall(r"^(node-\d) r(\d)\s*\| rank=(\d) host=(node-\d) coords=pp(\d)/dp(\d)/tp(\d)$", log, re.M)
    assert sorted(int(p[2]) for p in places) == list(range(8)), log[-4000:]
    for service, prefix_rank, rank, host, pp, dp, tp in places:
        assert service == host == f"node-{int(rank) // 4}" and prefix_rank == rank and int(pp) == int(rank) // 4
    assert "rank output  8/8 ranks printed" in log and "MISPLACED" not in log
    traffic = instrumented(run, 8, 3, log)
    closed = pipeline_bytes(dp=2, tp=2, batch=16, microbatches=2, dim=32)  # manual_3d's defaults
    for step in (2, 3):
        links, kinds = traffic[step]["links"], traffic[step]["bytes"]
        assert links["0->1"] == links["1->0"] == closed and kinds["pp_send"] == kinds["pp_recv"] == 2 * closed, \
            traffic[step]
        assert kinds["fsdp_all_gather"] > 0 and kinds["tp_all_reduce"] > 0 and kinds["world_all_reduce"] == 8 * 4
    ref = one_process(script, tmp_path / "ref", "--steps", "3")
    mesh = losses(run)
    assert all(abs(m - r) <= 1e-5 * abs(r) for m, r in zip(mesh, ref)) and len(mesh) == 3, (mesh, ref)
    head = out.index("step  A (mesh 2x2x2)  B (mesh 2x2x1)  rel_diff")
    rows = ROW.findall(out[head:])
    a, b = losses(tmp_path / "runs" / "a-mesh-2x2x2"), losses(tmp_path / "runs" / "b-mesh-2x2x1")
    assert [int(r[0]) for r in rows] == [1, 2, 3] and len(a) == len(b) == 3
    for (step, va, vb, diff), la, lb in zip(rows, a, b):
        assert float(diff) <= 1e-5 and abs(float(va) - la) <= 1e-7 * la and abs(float(vb) - lb) <= 1e-7 * lb
    assert "compare: OK: loss of A (mesh 2x2x2) and B (mesh 2x2x1) agree within rtol 1e-05 at all 3 steps" in out
    assert out.count("== summary: OK ==") == 2  # each run's own summary, as `up` shows it
    assert left_over(tmp_path / "runs" / "a-mesh-2x2x2") == left_over(tmp_path / "runs" / "b-mesh-2x2x1") == ""
    print(f"compare 2x2x2 vs 2x2x1, 3 steps: {took:.1f}s\n{out[head:]}")


def test_tp_peers_with_different_shards_diverge_at_step_2(tmp_path):
    """The variant reads its loss from the lines rank 0 prints (--metric-regex, cluster.log), quietly."""
    regex = r"^step (?P<step>\d+)/\d+ loss (?P<value>\S+)"
    proc, took = compare(tmp_path, copy_script(tmp_path, SHIFTED), "--quiet", "--metric-regex", regex,
                         a="1x1x2", b="1x1x1")
    out = proc.stdout
    assert proc.returncode == 1, out[-5000:] + proc.stderr[-2000:]
    assert "node-0 r0" not in out and "compare: run A (mesh 1x1x2) ok, 3 step(s) of loss" in out
    printed = {}
    for side in ("a-mesh-1x1x2", "b-mesh-1x1x1"):
        log = (tmp_path / "runs" / side / "cluster.log").read_text()
        printed[side] = re.findall(r"^node-0 r0 +\| step \d+/3 loss (\S+)", log, re.M)
    a, b = printed["a-mesh-1x1x2"], printed["b-mesh-1x1x1"]
    assert len(a) == len(b) == 3 and a[0] == b[0] and a[1] != b[1], printed
    assert (f"loss diverges at step 2: A (mesh 1x1x2) {float(a[1]):.8g}, B (mesh 1x1x1) {float(b[1]):.8g} "
            f"(rel diff ") in out, out[-3000:]
    assert out.rstrip().endswith("compare: FAILED: loss differs beyond rtol 1e-05 or in its steps (above)")
    rows = ROW.findall(out[out.index("step  A (mesh 1x1x2)"):])
    assert float(rows[0][3]) <= 1e-5 < float(rows[1][3])
    assert left_over(tmp_path / "runs" / "a-mesh-1x1x2") == left_over(tmp_path / "runs" / "b-mesh-1x1x1") == ""
    print(f"compare of the shifted variant: {took:.1f}s\n{out[out.index('compare loss'):]}")
