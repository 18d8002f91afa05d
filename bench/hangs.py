"""Every kind of hang on the cluster: each ends within --stall-s + 30 s, exit 4, its diagnosis printed.

    python -m bench.hangs --stall-s 10
    python -m bench.hangs --kinds skip,busy --layouts nodes --stall-s 10
    python -m bench.hangs --kinds shape --check-collectives --stall-s 10

Runs examples/hang.py (``--kind skip | recv-first | shape | microbatch | busy``, at step 3) with
``python -m launcher up --script examples/hang.py`` on 2 nodes x 2 ranks (``--nodes 2
--nproc-per-node 2``) and on a 2x2x2 mesh (``--mesh 2x2x2``), one run at a time, and prints one
row a run: the layout, the kind, `up`'s exit code, the seconds from the stall's start (the last
progress any rank made, hang.json's ``time - idle_s``) to `up`'s exit, the load average, and the
diagnosis as `up` printed it (a mismatch that gloo or torch's DETAIL check (--check-collectives) ends
before it can hang: its MISMATCH and FAILED rows). Needs Docker and the trainer image (SIMCLUSTER_IMAGE).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

KINDS = ("skip", "recv-first", "shape", "microbatch", "busy")
LAYOUTS = {"nodes": ["--nodes", "2", "--nproc-per-node", "2"], "mesh": ["--mesh", "2x2x2"]}


def run_one(kind: str, layout: str, stall_s: float, root: str, check: bool = False) -> dict:
    """One run of one kind on one layout: exit code, seconds from the stall's start to the exit, diagnosis."""
    run_dir = os.path.join(root, f"{layout}-{kind}{'-checked' if check else ''}")
    check = ["--check-collectives", "1"] if check else []
    cmd = [sys.executable, "-m", "launcher", "up", "--script", "examples/hang.py", *LAYOUTS[layout],
           "--stall-s", f"{stall_s:g}", "--run-dir", run_dir, "--quiet", *check, "--", "--kind", kind]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    end = time.time()
    try:
        with open(os.path.join(run_dir, "hang.json"), encoding="utf-8") as fh:
            hang = json.load(fh)
        after = end - (hang["time"] - hang["idle_s"])
        lines = hang["diagnosis"]
    except (OSError, ValueError, KeyError):  # no hang: a mismatch gloo or torch's DETAIL check ended the job
        out = proc.stdout.strip().splitlines()
        after = None
        lines = [line.strip() for line in out if line.lstrip().startswith(("MISMATCH", "FAILED rank"))] or out[-1:]
    return {"layout": layout, "kind": kind, "exit": proc.returncode, "after_s": after, "lines": lines,
            "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hangs", description=__doc__.split("\n\n")[0])
    p.add_argument("--stall-s", type=float, default=10.0)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--check-collectives", action="store_true", help="run each kind with --check-collectives 1")
    a = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-hangs-", dir=os.path.join(os.getcwd(), "runs") if os.path.isdir("runs") else None)
    bad = 0
    for layout in a.layouts.split(","):
        for kind in a.kinds.split(","):
            r = run_one(kind, layout, a.stall_s, root, a.check_collectives)
            ok = r["exit"] != 0 and (r["after_s"] is None or r["after_s"] <= a.stall_s + 30)
            bad += not ok
            after = f"{r['after_s']:.0f}" if r["after_s"] is not None else "-"
            print(f"| {layout} | {kind} | {r['exit']} | {after} s | {r['load']:.1f} | {' / '.join(r['lines'])} |",
                  flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
