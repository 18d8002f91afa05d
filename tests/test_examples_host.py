"""examples/pipelining.py on the host, no Docker: torch's pipelining with TP and FSDP2 trains the
same model as one process (losses within 1e-5 relative at every step).

    python -m pytest -q tests/test_examples_host.py

One process is the reference; torchrun --standalone runs 2x1x2 (4 ranks) with 1F1B over 4
microbatches, so that 1F1B really interleaves forwards and backwards (with 2 microbatches on 2
stages it is GPipe's order) and the global batch is microbatched differently from the reference.
2x2x2 with GPipe runs on containers (tests/test_user_code.py). About 22 s on 2 cores (reference
4 s, 2x1x2 14 s, the stage_range check 4 s of torch import).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "pipelining.py"
STEPS = 3


def run(out: Path, *args: str, nproc: int = 0) -> list[dict]:
    """Run the example (one process, or torchrun with nproc ranks); returns its metrics rows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMCLUSTER_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    launch = [sys.executable]
    if nproc:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    cmd = [*launch, str(SCRIPT), "--steps", str(STEPS), "--out-dir", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["total_steps"] == STEPS and r["step_time_s"] > 0 for r in rows)
    printed = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in printed] == [f"{s}/{STEPS}" for s in range(1, STEPS + 1)]
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    """The one-process losses (pp=dp=tp=1, GPipe, 2 microbatches)."""
    return [r["loss"] for r in run(tmp_path_factory.mktemp("ref"))]


# 2x2x2 with GPipe runs on containers (tests/test_user_code.py); here 1F1B in an order GPipe does not take
@pytest.mark.parametrize("mesh,schedule,microbatches", [("2x1x2", "1f1b", 4)])
def test_pipelining_matches_one_process(reference, tmp_path, mesh, schedule, microbatches):
    pp, dp, tp = (int(n) for n in mesh.split("x"))
    rows = run(tmp_path, "--pp", str(pp), "--dp", str(dp), "--tp", str(tp), "--schedule", schedule,
               "--microbatches", str(microbatches), nproc=pp * dp * tp)
    losses = [r["loss"] for r in rows]
    for step, (got, want) in enumerate(zip(losses, reference, strict=True), 1):
        assert abs(got - want) <= 1e-5 * abs(want), f"{mesh} {schedule} step {step}: {got} vs one process {want}"


def test_stage_range_splits_every_block_once():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from pipelining import stage_range
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert [list(stage_range(4, 2, s)) for s in range(2)] == [[0, 1], [2, 3]]
    assert [list(stage_range(7, 3, s)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert list(stage_range(4, 1, 0)) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        stage_range(2, 3, 0)
