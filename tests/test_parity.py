"""The parity matrix: every mesh and schedule against the single-process reference, through
``python -m train.parity`` (local processes, no Docker); tp peers; clipping. The matrix's pairs
run in a few parity commands of many pairs each (GROUPS), each pair's test asserting its own
table: one import of torch and the trainer a command instead of a pair.

    python -m pytest -q tests/test_parity.py
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import warm

MESHES = ["1x1x1", "1x1x2", "1x2x1", "2x1x1", "1x2x2", "2x1x2", "2x2x1", "2x2x2"]
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b"]
OTHER_SCHEDULES = ["looped-bfs", "interleaved-zb", "zbv", "dualpipev"]
STEPS = 3


def run_parity(*args: str, run_dir: Path | None = None, launcher: str = "forkrun", timeout: float = 600
               ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the parity tool; returns the process and its table rows parsed from stdout. The ranks
    start under forkrun (forked after one import, as on the cluster's nodes: about a third of
    torchrun's CPU on 2 cores), and the tool itself is forked from the worker's warm interpreter
    (tests/warm.py); the tool's default, torchrun, runs in the mismatch test, all fresh interpreters."""
    args = ("--model", "tiny", "--launcher", launcher, *args, *(("--run-dir", str(run_dir)) if run_dir else ()))
    if launcher == "forkrun":
        proc = warm.run("simcluster.train.parity", list(args), cwd=os.getcwd(), env=dict(os.environ), timeout=timeout)
    else:
        proc = subprocess.run([sys.executable, "-m", "simcluster.train.parity", *args], capture_output=True, text=True,
                              timeout=timeout)
    return proc, table_rows(proc.stdout)


def table_rows(text: str) -> list[dict]:
    """The step rows of every parity table in text."""
    rows = []
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)", line)
        if m:
            rows.append({"step": int(m[1]), "loss": float(m[2]), "ref_loss": float(m[3]),
                         "grad_norm": float(m[5]), "ref_grad_norm": float(m[6])})
    return rows


def run_pairs(meshes: list[str], schedules: list[str], *args: str, per_mesh_s: int = 300) -> dict:
    """One parity command over every (mesh, schedule) pair (the tool's lists): {(mesh, schedule):
    (passed, that pair's rows, its max_rel_loss_diff)}, and the process under key "proc"."""
    proc, _ = run_parity("--mesh", ",".join(meshes), "--schedule", ",".join(schedules), "--timeout", str(per_mesh_s),
                         *args, timeout=per_mesh_s * len(meshes) * len(schedules) + 300)
    out = {"proc": proc}
    verdicts = dict(re.findall(r"^parity: mesh (\S+ schedule \S+): (ok|FAILED.*)$", proc.stdout, re.M))
    blocks = re.split(r"^\[parity\] mesh (\S+) schedule (\S+): against one process$", proc.stdout, flags=re.M)
    tables = {(m, s): text for m, s, text in zip(blocks[1::3], blocks[2::3], blocks[3::3])}
    for mesh in meshes:
        for schedule in schedules:
            text = tables.get((mesh, schedule), "")
            found = re.search(r"^max_rel_loss_diff=(\S+)$", text, re.M)
            out[(mesh, schedule)] = (verdicts.get(f"{mesh} schedule {schedule}") == "ok", table_rows(text),
                                     float(found[1]) if found else None)
    return out


def max_rel(proc: subprocess.CompletedProcess) -> float:
    return float(re.search(r"^max_rel_loss_diff=(\S+)$", proc.stdout, re.M)[1])


def assert_parity(proc, rows, steps=STEPS):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_rows(rows, max_rel(proc), steps)


def assert_rows(rows: list[dict], max_rel_loss: float, steps: int = STEPS) -> None:
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert max_rel_loss < 1e-4
    assert abs(rows[0]["loss"] - rows[0]["ref_loss"]) / rows[0]["ref_loss"] < 1e-6
    # a real run: the first loss is about ln(256) = 5.55 and the reference's loss falls
    assert 5.3 < rows[0]["ref_loss"] < 5.8 and rows[-1]["ref_loss"] < rows[0]["ref_loss"]
    for r in rows:
        assert abs(r["grad_norm"] - r["ref_grad_norm"]) <= 1e-4 * r["ref_grad_norm"]


# With pp = 1 GPipe and 1F1B run one stage alike (all forwards, then all backwards, or alternating:
# the same sums), so one-stage meshes take 1F1B and the interleaved (two local stages) only.
MATRIX = [(m, s) for m in MESHES for s in SCHEDULES if not (m.startswith("1x") and s == "gpipe")]


# 2x2x2 with 1F1B and 4 microbatches, clipping engaged (max norm 0.05) and every rank's records on:
# the matrix's 2x2x2/1f1b point and the tp-peers test read this one run (the tiny model's grad norm
# is about 3-4 in these steps, so the default max norm 1.0 clips too: one code path, run once)
PEERS = ("--mesh", "2x2x2", "--schedule", "1f1b", "--steps", str(STEPS), "--max-norm", "0.05", "--microbatches", "4",
         "--rank-metrics", "1")


@pytest.fixture(scope="module")
def peers_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict], Path]:
    run_dir = tmp_path_factory.mktemp("peers")
    return (*run_parity(*PEERS, run_dir=run_dir), run_dir)


# The matrix in parity commands of several pairs each (the tool's lists: one import of torch and
# the trainer per command, not per pair), with the same flags each pair had alone; 2x2x2/1f1b is
# the peers run's. Each group runs once, when its first test asks.
MATRIX_ARGS = ("--steps", str(STEPS), "--microbatches", "4")
GROUPS = {
    "one_stage": ([m for m in MESHES if m.startswith("1x")], ["1f1b", "interleaved-1f1b"], MATRIX_ARGS),
    "two_stages": ([m for m in MESHES if m.startswith("2x") and m != "2x2x2"], SCHEDULES, MATRIX_ARGS),
    "two_stages_2x2x2": (["2x2x2"], ["gpipe", "interleaved-1f1b"], MATRIX_ARGS),
    "other_schedules": (["2x2x2"], OTHER_SCHEDULES, ("--steps", str(STEPS))),
}


@pytest.fixture(scope="module")
def groups():
    """Group name -> its run_pairs result, filled on first use."""
    return {}


def pair_result(groups: dict, mesh: str, schedule: str) -> tuple[list[dict], float]:
    """(rows, max_rel_loss_diff) of the pair, from its group's command (run on first use); fails
    the test when the tool did not pass the pair."""
    name = next(n for n, (meshes, schedules, _) in GROUPS.items() if mesh in meshes and schedule in schedules)
    if name not in groups:
        meshes, schedules, args = GROUPS[name]
        groups[name] = run_pairs(meshes, schedules, *args)
    result = groups[name]
    passed, rows, loss_diff = result[(mesh, schedule)]
    proc = result["proc"]
    assert passed and loss_diff is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return rows, loss_diff


@pytest.mark.parametrize("mesh,schedule", MATRIX)
def test_parity_matrix(mesh, schedule, request, groups):
    if (mesh, schedule) == ("2x2x2", "1f1b"):
        proc, rows, _ = request.getfixturevalue("peers_run")
        assert_parity(proc, rows)
        return
    rows, loss_diff = pair_result(groups, mesh, schedule)
    assert_rows(rows, loss_diff)


def test_parity_four_stages():
    """4x1x2: four pipeline stages (two hold the embedding and the head), tp in each."""
    proc, rows = run_parity("--mesh", "4x1x2", "--schedule", "1f1b", "--steps", str(STEPS))
    assert_parity(proc, rows)


@pytest.mark.parametrize("schedule", OTHER_SCHEDULES)
def test_parity_other_schedules(schedule, groups):
    rows, loss_diff = pair_result(groups, "2x2x2", schedule)
    assert_rows(rows, loss_diff)


def test_the_groups_cover_the_matrix_once():
    """Every pair of MATRIX but the peers run's, and every other schedule, in exactly one group."""
    pairs = [(m, s) for meshes, schedules, _ in GROUPS.values() for m in meshes for s in schedules]
    assert sorted(pairs) == sorted([p for p in MATRIX if p != ("2x2x2", "1f1b")] +
                                   [("2x2x2", s) for s in OTHER_SCHEDULES])


def test_tp_peers_bit_identical_and_clipping(peers_run):
    """Small max norm so clipping is active: every rank sees the reference norm, tp peers
    see bit-identical inputs and losses, dp ranks see different inputs."""
    proc, rows, tmp_path = peers_run
    assert_parity(proc, rows)
    assert all(r["ref_grad_norm"] > 0.05 for r in rows)  # clipping really engaged
    ranks = {}
    for r in range(8):
        lines = (tmp_path / "mesh" / "ranks" / f"rank-{r}.jsonl").read_text().splitlines()
        ranks[r] = [json.loads(line) for line in lines]
    for step in range(STEPS):
        norms = {float.fromhex(ranks[r][step]["grad_norm"]) for r in range(8)}
        assert len(norms) == 1
        assert abs(norms.pop() - rows[step]["ref_grad_norm"]) <= 1e-4 * rows[step]["ref_grad_norm"]
        for pp in range(2):
            for dp in range(2):
                a, b = ranks[pp * 4 + dp * 2], ranks[pp * 4 + dp * 2 + 1]  # the two tp peers
                assert a[step]["inputs_sha1"] == b[step]["inputs_sha1"]
                assert a[step]["losses"] == b[step]["losses"]
            assert ranks[pp * 4][step]["inputs_sha1"] != ranks[pp * 4 + 2][step]["inputs_sha1"]
        assert len(ranks[4][step]["losses"]) == 4 and ranks[0][step]["losses"] == []  # last stage only


def test_parity_tool_fails_on_mismatch():
    """A negative tolerance no run can meet, on a list of two pairs under stock torchrun (one rank
    each: every rank there is a fresh interpreter importing torch): the tool runs both, exits 1 and
    names each failed pair."""
    proc, rows = run_parity("--mesh", "1x1x1", "--schedule", "1f1b,interleaved-1f1b", "--steps", "2", "--tolerance",
                            "-1", launcher="torchrun")
    assert len(rows) == 4 and proc.returncode == 1 and "parity failed" in proc.stderr, proc.stderr[-3000:]
    assert "[parity] mesh 1x1x1 schedule 1f1b " in proc.stdout
    assert ": -m torch.distributed.run --standalone --nproc-per-node=1 " in proc.stdout
    assert "parity: 0/2 pairs passed" in proc.stdout
    for schedule in ("1f1b", "interleaved-1f1b"):
        failed = f"parity: mesh 1x1x1 schedule {schedule}: FAILED: loss diverges at step 1: "
        assert failed in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("args, message", [
    (["--mesh", "2x2"], "valid examples"),
    (["--mesh", "2x1x1,2x2"], "mesh 2x2 schedule default: "),
    (["--mesh", "2x1x1,,1x1x2"], "mesh: give one value or a comma-separated list"),
    (["--schedule", "1f1b,1f1b"], "schedule: give one value or a comma-separated list"),
])
def test_parity_tool_bad_config_exits_2(args, message, tmp_path):
    """A bad mesh, alone or in a list, stops the tool before any run (nothing in the run folder)."""
    proc, _ = run_parity(*args, run_dir=tmp_path / "parity")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "parity").exists()


def test_seed_model_parity_with_tp_peers_fed_alike():
    """The ``seed`` preset (the original toy stack) on 2x2x2: equal to one process, so the tp
    ranks of a group can no longer be fed different inputs and print different losses."""
    proc, rows = run_parity("--mesh", "2x2x2", "--model", "seed", "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(rows) == STEPS and max_rel(proc) < 1e-4
    assert 2.0 < rows[0]["ref_loss"] < 2.7  # about ln(10) = 2.30 for 10 random-init classes
