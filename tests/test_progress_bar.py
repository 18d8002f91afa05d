"""`launcher up`'s progress: a rich bar on a terminal, the plain one-line-per-step otherwise.

    python -m pytest -q tests/test_progress_bar.py
"""
from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

from simcluster.launcher.observe.progress import Bar

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
from simcluster.launcher.observe.progress import Bar, Progress
import sys
assert Bar.wanted(sys.stdout)
bar, p = Bar(), Progress()
for s in (1, 2, 3):
    p.update({"step": s, "total": 3, "loss": 5.0 - s, "tokens_per_s": 1234.0})
    bar.update(p)
    print(f"node-0 r0 | line {s}")
bar.close()
"""


def test_no_bar_when_not_a_terminal():
    assert not Bar.wanted(io.StringIO())


def test_bar_on_a_terminal_shows_step_loss_tokens_eta():
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=follower, stderr=follower, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "3/3" in text and "loss 2.0000" in text and "tokens/s 1234" in text and "ETA" in text
    assert "line 3" in text
