"""`python -m launcher report`: figures and page from a run folder, a user's minimal metrics, bad folders.

    python -m pytest -q tests/test_report.py
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "report", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_report_of_a_full_run(tmp_path):
    rows = [{"step": s, "total_steps": 3, "loss": 5.5 - 0.1 * s, "tokens_per_s": 1000 + s, "rss_mb": [300, 310 + s],
             "traffic": {"bytes": {"pp_send": 262144}, "messages": {"pp_send": 2},
                         "links": {"0->0": 0, "0->1": 131072, "1->0": 131072, "1->1": 0, "span": 48}}}
            for s in (1, 2, 3)]
    rows[-1]["val_loss"] = 5.3
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.yaml").write_text("mesh: 2x1x1\n")
    proc = report("--run-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in (tmp_path / "report").glob("*.png")}
    assert names == {"loss.png", "tokens_per_s.png", "memory.png", "traffic.png"}
    assert all(png_size(p)[0] > 300 for p in (tmp_path / "report").glob("*.png"))
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "mesh: 2x1x1" in page and "final loss" in page
    assert f"report: {tmp_path}/report/index.html" in proc.stdout


def test_report_of_a_users_script_needs_only_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "loss": 1.5}\n')
    proc = report("--run-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in (tmp_path / "report").glob("*.png")} == {"loss.png"}


def test_report_refuses_a_folder_without_metrics(tmp_path):
    proc = report("--run-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "metrics.jsonl" in proc.stderr and "--run-dir" in proc.stderr
    assert not (tmp_path / "report").exists()
    (tmp_path / "metrics.jsonl").write_text("not json\n")
    proc = report("--run-dir", str(tmp_path))
    assert proc.returncode == 2 and "line 1: not JSON" in proc.stderr


def test_bubble_and_textbook_values():
    from simcluster.core.timeline import bubble, textbook_bubble

    def ev(rank, ts, dur, step=3):
        return {"ph": "X", "cat": "compute", "name": "forward mb0 s0", "ts": ts, "dur": dur, "tid": rank,
                "args": {"step": step}}
    # rank 0 busy 0-6 (with an overlap counted once), rank 1 busy 4-10: window 0-10
    events = [ev(0, 0, 4), ev(0, 2, 4), ev(1, 4, 6), {"ph": "X", "cat": "comm", "ts": 0, "dur": 10, "tid": 1,
                                                      "args": {"step": 3}}]
    assert bubble(events) == {3: (0.4 + 0.4) / 2}
    assert textbook_bubble("1f1b", 2, 2) == 1 / 3 and textbook_bubble("gpipe", 4, 8) == 3 / 11
    assert textbook_bubble("zbv", 4, 4) is None
