"""The step-by-step comparison both `launcher compare` and `train.parity` use (simcluster/core/series.py):
alignment, relative difference, first divergence, the table text. Pure: no Docker, no torch.

    python -m pytest -q tests/test_series.py
"""
from __future__ import annotations

import math
import re

import pytest

from simcluster.core.series import compare_series, rel, series_from_rows, spans, table_text
from simcluster.core.series_read import metric_pattern, series_from_lines, series_from_rank_lines

# examples/manual_3d.py, 3 steps: mesh 2x2x2 against 2x2x1 on the cluster (metrics.jsonl's loss)
A = [(1, 0.7218401432037354), (2, 0.8116353750228882), (3, 0.7675373554229736)]
B = [(1, 0.7218402028083801), (2, 0.8116353154182434), (3, 0.7675374150276184)]


def test_rel_is_relative_to_b_absolute_at_zero_infinite_for_nan():
    assert rel(0.5, 0.4) == pytest.approx(0.25)
    assert rel(0.4, 0.5) == pytest.approx(0.2)
    assert rel(0.25, 0.0) == 0.25 and rel(0.0, 0.0) == 0.0
    assert rel(math.nan, 1.0) == math.inf and rel(1.0, math.nan) == math.inf and rel(math.nan, math.nan) == math.inf
    assert rel(math.inf, math.inf) == 0.0 and rel(math.inf, 1.0) == math.inf


def test_measured_manual_3d_series_agree_within_1e_5():
    c = compare_series(A, B, 1e-5, "loss", ("A (mesh 2x2x2)", "B (mesh 2x2x1)"))
    assert c.ok and c.first_divergence is None and not c.only_a and not c.only_b
    assert [r.step for r in c.rows] == [1, 2, 3]
    assert c.worst.step == 1 and c.max_rel == pytest.approx(8.257e-08, rel=1e-3)
    assert c.table() == (
        "step  A (mesh 2x2x2)  B (mesh 2x2x1)  rel_diff\n"
        "   1      0.72184014       0.7218402   8.3e-08\n"
        "   2      0.81163538      0.81163532   7.3e-08\n"
        "   3      0.76753736      0.76753742   7.8e-08")
    assert c.problems() == []
    assert c.verdict() == ["max rel diff 8.257e-08 at step 1 (within rtol 1e-05, 3 step(s) compared)"]


def test_first_divergence_names_the_step_and_both_values():
    a = [A[0], (2, 0.8223), (3, 0.7001)]
    c = compare_series(a, B, 1e-5, "loss", ("A", "B"))
    assert not c.ok and c.first_divergence.step == 2
    assert (c.first_divergence.a, c.first_divergence.b) == (0.8223, 0.8116353154182434)
    assert c.first_divergence.rel == pytest.approx(0.013141, rel=1e-4)
    assert c.worst.step == 3 and c.max_rel == pytest.approx(0.08786, rel=1e-3)
    assert c.problems() == ["loss diverges at step 2: A 0.8223, B 0.81163532 (rel diff 1.3e-02 > rtol 1e-05)"]
    assert c.verdict()[-1] == "max rel diff 8.786e-02 at step 3 (beyond rtol 1e-05, 3 step(s) compared)"


def test_rtol_zero_is_bit_identical_and_a_negative_rtol_is_never_met():
    assert compare_series(A, A, 0.0).ok and not compare_series(A, B, 0.0).ok
    c = compare_series(A, A, -1.0)  # train.parity --tolerance -1: its test of the failing path
    assert not c.ok and c.first_divergence.step == 1


def test_different_lengths_compare_the_common_steps_and_are_not_ok():
    c = compare_series(A, B[:2] + [(5, 0.7)], 1e-5, "loss", ("A", "B"))
    assert [r.step for r in c.rows] == [1, 2] and c.only_a == ((3, 0.7675373554229736),) and c.only_b == ((5, 0.7),)
    assert not c.ok and c.first_divergence is None
    assert c.problems() == ["loss: A has 3 steps, B has 3; only A has step(s) 3; only B has step(s) 5; "
                            "compared the 2 common step(s)"]
    lines = c.table().splitlines()
    assert lines[3:] == ["   3  0.76753736           -   missing", "   5           -         0.7   missing"]


def test_no_common_step_and_empty_series():
    c = compare_series([(1, 1.0)], [(2, 1.0)], 1e-5)
    assert not c.ok and c.rows == () and math.isnan(c.max_rel) and c.worst is None
    assert c.problems() == ["loss: A has 1 steps, B has 1; only A has step(s) 1; only B has step(s) 2; no common step"]
    e = compare_series([], [], 1e-5)
    assert not e.ok and e.problems() == ["loss: no step to compare, both series are empty"]


def test_alignment_is_by_step_and_a_repeated_step_keeps_its_first_value():
    c = compare_series([(2, 2.0), (1, 1.0), (2, 9.0)], [(1, 1.0), (2, 2.0)], 0.0)
    assert c.ok and [(r.step, r.a) for r in c.rows] == [(1, 1.0), (2, 2.0)]


def test_parity_table_of_two_comparisons_keeps_its_columns():
    loss = compare_series([(1, 5.5932443), (2, 5.4939395)], [(1, 5.593245), (2, 5.4939399)], 1e-4, "loss",
                          ("loss", "ref_loss"))
    norm = compare_series([(1, 3.8234352), (2, 4.1660564)], [(1, 3.8234353), (2, 4.1660565)], math.inf, "grad_norm",
                          ("grad_norm", "ref_norm"))
    text = table_text([loss, norm])
    assert text.splitlines()[0].split() == ["step", "loss", "ref_loss", "rel_diff", "grad_norm", "ref_norm",
                                            "rel_diff"]
    row = re.compile(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")  # tests/test_parity.py's
    assert [row.fullmatch(line).group(1, 2, 6) for line in text.splitlines()[1:]] == [
        ("1", "5.5932443", "3.8234353"), ("2", "5.4939395", "4.1660565")]


def test_series_from_metrics_rows():
    rows = [{"step": 1, "loss": 0.5, "total_steps": 2}, {"note": "no step"}, {"step": 2, "loss": 1},
            {"step": True, "loss": 3.0}, {"step": 3, "val_loss": 0.2}]
    assert series_from_rows(rows, "loss") == [(1, 0.5), (2, 1.0)]
    assert series_from_rows(rows, "val_loss") == [(3, 0.2)]
    with pytest.raises(ValueError, match=r"'loss' at step 4 is 'nan!', not a number"):
        series_from_rows([{"step": 4, "loss": "nan!"}], "loss")


LINES = ["rank=0 host=node-0 coords=pp0/dp0/tp0", "step 1/3 loss 0.721840 step_time 0.400s",
         "step 2/3 loss 0.811635 step_time 0.172s", "step 3/3 loss 0.767537 step_time 0.173s"]


def test_series_from_lines_with_one_group_or_named_step_and_value():
    assert series_from_lines(LINES, metric_pattern(r"loss (\S+)")) == [(1, 0.72184), (2, 0.811635), (3, 0.767537)]
    named = metric_pattern(r"^step (?P<step>\d+)/\d+ loss (?P<value>\S+)")
    assert series_from_lines(LINES[2:] + LINES, named) == [(2, 0.811635), (3, 0.767537), (1, 0.72184),
                                                          (2, 0.811635), (3, 0.767537)]
    assert series_from_lines(LINES, metric_pattern(r"step_time (?P<value>[\d.]+)s")) == [(1, 0.4), (2, 0.172),
                                                                                        (3, 0.173)]
    with pytest.raises(ValueError, match=r"matched 'step 1/3 loss 0.721840 .*', but its step '1' or value 'loss'"):
        series_from_lines(LINES, metric_pattern(r"step (?P<step>\d+)/\d+ (?P<value>\w+)"))


@pytest.mark.parametrize("text,why", [("loss", "has 0 group"), (r"(\d+) (\d+)", "has 2 group"),
                                      (r"(?P<step>\d+)", "named step"), ("(", "not a regular expression")])
def test_metric_pattern_refuses_other_groups(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        metric_pattern(text)


def test_spans():
    assert spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10" and spans([]) == ""


@pytest.mark.parametrize("line,step,value", [
    ("loss: 1.23", None, 1.23), ("loss=1.23", None, 1.23), ("Loss 1.23", None, 1.23),
    ("step 3 | loss 1.23", 3, 1.23), ("step 3/10 loss 0.716 step_time 0.2s", 3, 0.716),
    ("Step [3/10], Loss: 0.5", 3, 0.5), ("\x1b[31mstep:  3  \x1b[32mloss:  8.1521  \x1b[33mgrad_norm:  1.2", 3, 8.1521),
    ("epoch 1 train_loss=0.3", None, 0.3), ("Loss tensor(0.25, grad_fn=<MseLossBackward0>)", None, 0.25),
    ("loss: nan", None, math.nan),
    ("val_loss: 2.0", None, None), ("loss_scale 1024", None, None), ("train/loss 3", None, None),
    ("computing the loss now", None, None), ("rank=0 host=node-0", None, None),
])
def test_the_printed_loss_formats_read_by_default(line, step, value):
    rank, series = series_from_rank_lines([(2, line)])
    if value is None:
        assert (rank, series) == (None, []), series
    else:
        assert rank == 2 and series[0][0] == (step or 1) and (series[0][1] == value or math.isnan(value)), series


def test_a_loss_every_rank_prints_counts_once_a_step_from_the_highest_rank():
    lines = [(3, "loss: 9"), (1, "loss 2.0"), (0, "hello"), (1, "loss 1.5"), (3, "loss: 8")]
    assert series_from_rank_lines(lines) == (3, [(1, 9.0), (2, 8.0)])
    pp = [(r, f"step: {s}  loss: {-2.0 if r < 4 else 8.1 - s}") for s in (1, 2) for r in range(8)]
    assert series_from_rank_lines(pp) == (7, [(1, 7.1), (2, 6.1)])  # torchtitan on pp 2: stage 0 prints -2.0
