"""The built-in trainer under `plan --full-size` agrees with today's analytic planner, and a full-size
pipeline's bubble is torch's schedule order run on the stages' seconds.

    python -m pytest -q -n 0 tests/test_fullsize_agree.py

One full-size run of the built-in trainer (`--mesh 2x1x2 --model small`, 4 microbatches, 1F1B,
`--ranks 0,2`: two fake ranks, the first of each pipeline stage, each with tensor parallelism of 2;
ranks 1 and 3 stood for) serves every assertion of the agreement; the tolerances and their reasons
are train/plan/fullsize/agree.py's. With tp > 1 the step holds TP's all-reduces on the critical path
(waited by the next op) in both plans.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.core.flags import add_config_args, config_from_args
from simcluster.train.plan.fullsize.agree import BUBBLE_TOLERANCE, agreement
from simcluster.train.plan.fullsize.device import constants
from simcluster.train.plan.fullsize.schedule import StageTimes, pipeline
from simcluster.train.plan.fullsize.trace import read
from simcluster.train.preflight import preflight

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--mesh", "2x1x2", "--model", "small", "--microbatches", "4", "--steps", "2"]
RANKS = (0, 2)  # the first rank of each stage; its tp peer is stood for


@pytest.fixture(scope="module")
def builtin_run(tmp_path_factory):
    """The built-in trainer's full-size plan by its natural spelling (the trainer's flags, no --script)."""
    d = tmp_path_factory.mktemp("fullsize-builtin")
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", *FLAGS, "--gpu", "h100-96g",
           "--ranks", ",".join(map(str, RANKS)), "--trace-dir", str(d), "--json"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout), d


def test_builtin_trainer_runs_full_size(builtin_run):
    """Both stages ran (one rank each), every rank fits, the step is timed through 1F1B's order,
    and the batches were real: no placeholder answered a line of train/data.py."""
    data, _ = builtin_run
    assert [r["rank"] for r in data["ranks"]] == list(RANKS) and all(r["fits"] for r in data["ranks"])
    assert all(r["schedule"] == "1f1b" and 0 < r["bubble"] < 0.5 and r["step_s"] > 0 for r in data["ranks"])
    assert data["ranks"][0]["tokens_per_s"] > 0  # stage 0 looked its tokens up
    assert not [line for line in data["placeholders"] if "train/data.py" in line]


def test_agrees_with_the_analytic_plan(builtin_run):
    """Memory, FLOPs, the step on the FLOP clock and the bubble, rank by rank, within agree.py's tolerances;
    the traces hold TP's functional all-reduces (group of 2), which both steps put on the critical path."""
    _, d = builtin_run
    ap = argparse.ArgumentParser()
    add_config_args(ap)
    run = preflight(config_from_args(ap.parse_args(FLAGS)), world_size=None)
    traces = {r: read(str(d / f"trace-{r}.json")) for r in RANKS}
    assert all(any(e[0] == "c" and e[1] == "all_reduce" and e[3] == 2 for e in t.events) for t in traces.values())
    rows = agreement(run, traces, constants("h100-96g"))
    assert [m for a in rows for m in a.misses()] == []
    assert all(1.0 <= a.memory_ratio and a.flops_ratio == pytest.approx(1.0, rel=1e-3) for a in rows)
    textbook = (2 - 1) / (4 + 2 - 1)
    assert all(abs(a.fullsize_bubble - textbook) < BUBBLE_TOLERANCE for a in rows)
    assert all(a.sent_bubble >= a.fullsize_bubble for a in rows)  # the sends only add waiting


@pytest.mark.parametrize("schedule,pp,m", [("1f1b", 2, 4), ("1f1b", 4, 8), ("gpipe", 4, 4)])
def test_equal_stages_give_the_textbook_bubble(schedule, pp, m):
    """Equal stages (backward twice the forward), free sends: torch's order gives (pp-1)/(m+pp-1)."""
    stages = [StageTimes(r, pp, 1.0, 2.0, 0.0, 0.0, m) for r in range(pp)]
    got = pipeline(stages, schedule, 1, m)
    assert got.bubble == pytest.approx((pp - 1) / (m + pp - 1))
    assert got.window_s == pytest.approx(3.0 * (m + pp - 1))
