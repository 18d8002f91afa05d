"""Your code's working directory and the run folder's record of the code (launcher/container/workdir.py),
without Docker: what a node does before its ranks start.

    python -m pytest -q tests/test_workdir.py

The clusters that use it: tests/test_user_code.py (relative reads and writes of 4 ranks on 2 nodes)
and tests/test_frameworks.py (a relative DCP checkpoint of 4 ranks).
"""
from __future__ import annotations

import os

from simcluster.launcher.container import workdir


def test_links_copy_and_a_new_up_into_the_same_folder(tmp_path, monkeypatch):
    code, run = tmp_path / "code", tmp_path / "code" / "runs" / "r"  # runs/ inside the project, as users keep it
    (code / "pkg").mkdir(parents=True)
    (code / "data.txt").write_text("beside the script\n")
    (code / "pkg" / "m.py").write_text("x = 1\n")
    (code / "runs" / "old").mkdir(parents=True)
    (code / "runs" / "old" / "cluster.log").write_text("an earlier run\n")
    run.mkdir()
    monkeypatch.setenv("SIMCLUSTER_RESTART_COUNT", "0")
    line = workdir.prepare(str(code), str(run / "work"), str(run), first=True)
    assert line == f"code: 2 files (24 bytes) copied to {run / 'code'}"  # not the run folders inside
    assert (run / "work" / "data.txt").read_text() == "beside the script\n"  # a relative read works
    assert os.readlink(run / "work" / "data.txt") == str(code / "data.txt")
    assert not (run / "code" / "runs" / "old").exists() and not (run / "code" / "runs" / "r").exists()
    (run / "work" / "checkpoint").mkdir()  # a relative write of the first run
    # a new `up` into the same folder with other code: the record is replaced, stale links go, outputs stay
    (code / "data.txt").unlink()
    (code / "other.py").write_text("y = 2\n")
    assert workdir.prepare(str(code), str(run / "work"), str(run), first=True).startswith("code: 2 files (12 bytes)")
    assert sorted(os.listdir(run / "work")) == ["checkpoint", "other.py", "pkg", "runs"]
    assert sorted(os.listdir(run / "code")) == ["other.py", "pkg", "runs"]
    monkeypatch.setenv("SIMCLUSTER_RESTART_COUNT", "1")  # a restart of the same run keeps its record
    assert workdir.prepare(str(code), str(run / "work"), str(run), first=True) == f"code: recorded before in {run / 'code'}"
    assert workdir.prepare(str(code), str(run / "work"), str(run), first=False) is None  # other nodes only link


def test_above_the_limit_a_list_with_hashes(tmp_path):
    code, run = tmp_path / "code", tmp_path / "run"
    code.mkdir()
    run.mkdir()
    (code / "big.bin").write_bytes(b"\0" * 1000)
    (code / "a.py").write_text("print(1)\n")
    line = workdir.record(str(code), str(run), limit=100)
    assert line == f"code: 2 files (1009 bytes, above 100) listed with their sha256 in {run / 'code.sha256'}"
    rows = (run / "code.sha256").read_text().splitlines()
    assert rows[0] == "# 2 files, 1009 bytes: above the copy limit of 100 bytes, listed, not copied"
    digest, size, name = rows[1].split()
    assert len(digest) == 64 and (size, name) == ("9", "a.py") and rows[2].endswith("  1000  big.bin")
    assert not (run / "code").exists()
