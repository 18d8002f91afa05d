"""Each known torch bug (launcher/observe/failures.py TORCH_BUGS) still present in the installed torch:
reproduced on the host, so that this test fails the day torch fixes one and its entry can go.

    python -m pytest -q tests/test_torch_bugs.py      # about 10 s (tests/tp_compile_check.py, one process)

tp-compile-act-grad: tests/tp_compile_check.py on torch's fake process group of world 2, the block compiled
(aot_eager: AOT autograd, where the bug is; inductor fails the same way). TP alone raises the error whose
traceback the summary names (checked through RankTrace and failure_hint, as the summary reads a rank);
FSDP2 x TP gives the embedding a zero gradient. The controls: eager, and the same compiled block fed a
plain tensor, agree on a non-zero gradient, so a zero or an error comes from the compiled region's input.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import need_torch

from simcluster.launcher.observe.failures import TORCH_BUGS, RankTrace, failure_hint, torch_bug

ROOT = Path(__file__).resolve().parent.parent
FIXED = ("torch no longer has bug {name} ({got}): remove its TORCH_BUGS entry (launcher/observe/failures.py), "
         "its section in docs/own-code.md 'Known torch failures' and this test's case")


def test_tp_under_compile_still_loses_the_embeddings_gradient():
    need_torch()
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "tp_compile_check.py"), "--traceback"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]  # the program is quiet: no warning of torch's or ours
    got = json.loads(proc.stdout)
    for case in ("tp", "fsdp_tp"):  # the controls: a real, non-zero gradient, compiled or not
        assert isinstance(got[f"{case}/eager"], float) and got[f"{case}/eager"] > 0, got
        assert got[f"{case}/compiled_plain"] == got[f"{case}/eager"], got
    bug = next(b for b in TORCH_BUGS if b.name == "tp-compile-act-grad")
    assert got["tp/compiled"] == "AttributeError: 'Tensor' object has no attribute '_local_tensor'", \
        FIXED.format(name=bug.name, got=f"tp/compiled gave {got['tp/compiled']!r}")
    assert got["fsdp_tp/compiled"] == 0.0, \
        FIXED.format(name=bug.name, got=f"fsdp_tp/compiled gave {got['fsdp_tp/compiled']!r}")
    trace = RankTrace()
    for line in got["traceback"]:
        trace.feed(line)
    assert torch_bug(trace.lines()) is bug, trace.lines()  # the traceback the summary reads names this bug
    assert failure_hint(trace.lines()) == bug.hint()
