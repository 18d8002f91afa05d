"""`launcher compare` on real containers: the hand-written 3D script on two meshes agrees step by
step, and a variant whose tp peers get different batch shards is caught at its first bad step.

    python -m pytest -q tests/test_compare.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_compare.py    # fails instead

Each compare is two cluster runs (mesh 2x2x2, then 2x2x1) of examples/manual_3d.py copied to a
folder outside the repository, 3 steps: 40-130 s per test on this 2-core machine (the file: 117 s
when quiet, 153 s at load 6, 237 s at load 8).
Needs the image simcluster/trainer (bash images/build.sh); --mount-code runs this checkout's code.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simcluster.launcher.handle import Handle

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]
ROW = re.compile(r"^ +(\d+) +(\S+) +(\S+) +(\S+)$", re.M)  # step, A, B, rel_diff
SHIFT = "        x, y = x[dp_i * shard:(dp_i + 1) * shard], y[dp_i * shard:(dp_i + 1) * shard]\n"
# from step 2 on, tp rank 1 takes its batch shard one sample later than its tp peer (wrong: peers need one input)
SHIFTED = ('        if step >= 2 and mesh["tp"].get_local_rank() == 1:\n'
           '            x, y = x.roll(-1, 0), y.roll(-1, 0)\n' + SHIFT)


def compare(tmp_path: Path, script: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher", "compare", "--script", str(script), "--mesh", "2x2x2",
                           "--against", "2x2x1", "--mount-code", "--run-dir", str(tmp_path / "runs"), *args, "--",
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


def test_manual_3d_on_2x2x2_agrees_with_2x2x1(tmp_path):
    proc, took = compare(tmp_path, copy_script(tmp_path))
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
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
    proc, took = compare(tmp_path, copy_script(tmp_path, SHIFTED), "--quiet", "--metric-regex", regex)
    out = proc.stdout
    assert proc.returncode == 1, out[-5000:] + proc.stderr[-2000:]
    assert "node-0 r0" not in out and "compare: run A (mesh 2x2x2) ok, 3 step(s) of loss" in out
    printed = {}
    for side in ("a-mesh-2x2x2", "b-mesh-2x2x1"):
        log = (tmp_path / "runs" / side / "cluster.log").read_text()
        printed[side] = re.findall(r"^node-0 r0 +\| step \d+/3 loss (\S+)", log, re.M)
    a, b = printed["a-mesh-2x2x2"], printed["b-mesh-2x2x1"]
    assert len(a) == len(b) == 3 and a[0] == b[0] and a[1] != b[1], printed
    assert (f"loss diverges at step 2: A (mesh 2x2x2) {float(a[1]):.8g}, B (mesh 2x2x1) {float(b[1]):.8g} "
            f"(rel diff ") in out, out[-3000:]
    assert out.rstrip().endswith("compare: FAILED: loss differs beyond rtol 1e-05 or in its steps (above)")
    rows = ROW.findall(out[out.index("step  A (mesh 2x2x2)"):])
    assert float(rows[0][3]) <= 1e-5 < float(rows[1][3])
    assert left_over(tmp_path / "runs" / "a-mesh-2x2x2") == left_over(tmp_path / "runs" / "b-mesh-2x2x1") == ""
    print(f"compare of the shifted variant: {took:.1f}s\n{out[out.index('compare loss'):]}")
