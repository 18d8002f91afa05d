"""Start-up of a warm cluster: seconds from `launcher up` to each milestone of its first step.

    python -m bench.startup                          # 2x2x2, small, 3 runs
    python -m bench.startup --mesh 2x2x2 --runs 5 --torchrun
    python -m bench.startup --runs 4 --image simcluster/trainer:latest --image simcluster/trainer:other   # paired

Runs ``python -m launcher up --mesh MESH --model small --steps 2 --val-every 0`` (the image as
built: ``python -m launcher build`` first) ``--runs`` times in a row (per ``--image``,
alternating), stamps each line of its output on arrival, and prints one markdown row a run: the
image, the load average before it, then the seconds from the command to the first rank output
(rank 0's config line), the last rank's banner (process groups made, the model built and
sharded), step 1 done and step 2 done. Step 1 minus the banner is the first step with its
warm-up; step 2 minus step 1 a steady step.
Needs Docker and the trainer image. The performance issue's target: step 1 done <= 8 s.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from simcluster.core.errors import ConfigError
from simcluster.core.config import parse_mesh
from bench.args import positive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MILESTONES = {"config": re.compile(r"\[simcluster\] config: "), "banner": re.compile(r"\[simcluster\] rank=\d+ "),
              "step 1": re.compile(r"\bstep 1/\d+ loss "), "step 2": re.compile(r"\bstep 2/\d+ loss ")}


def one_run(mesh: str, world_size: int, extra: list[str]) -> dict[str, float]:
    """One `launcher up`: seconds from its start to each milestone (the banner: the last rank's).
    Raises RuntimeError with the output's tail when it exits non-zero."""
    run_dir = os.path.join(tempfile.mkdtemp(prefix="bench-startup-"), "run")
    cmd = [sys.executable, "-m", "launcher", "up", "--mesh", mesh, "--model", "small", "--steps", "2",
           "--val-every", "0", "--run-dir", run_dir, *extra]
    t0 = time.monotonic()
    seen: dict[str, float] = {}
    banners = 0
    lines = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            now = time.monotonic() - t0
            lines.append(line)
            for name, pattern in MILESTONES.items():
                if pattern.search(line):
                    if name == "banner":
                        banners += 1
                        if banners == world_size:
                            seen[name] = now
                    else:
                        seen.setdefault(name, now)
    if proc.returncode != 0 or len(seen) < len(MILESTONES):
        raise RuntimeError(f"launcher up exited {proc.returncode}, milestones {sorted(seen)}:\n" + "".join(lines[-40:]))
    return seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--mesh", default="2x2x2", help="pp x dp x tp (default 2x2x2)")
    p.add_argument("--runs", type=positive(int), default=3, help="runs in a row (default 3)")
    p.add_argument("--torchrun", action="store_true", help="stock torchrun on the nodes (a fresh interpreter a rank)")
    p.add_argument("--image", action="append", default=[],
                   help="the trainer image (default: the built one); given twice or more, the runs alternate "
                        "between them (a paired comparison: each row names its image)")
    args = p.parse_args(argv)
    try:
        world_size = parse_mesh(args.mesh).world_size
    except ConfigError as e:
        p.error(str(e))
    images = args.image or [None]
    print("| run | image | load avg | config line s | last banner s | step 1 done s | step 2 done s |")
    print("|---|---|---|---|---|---|---|")
    done: dict[str | None, list[float]] = {image: [] for image in images}
    for i in range(args.runs * len(images)):
        image = images[i % len(images)]
        load = os.getloadavg()[0]
        extra = (["--torchrun"] if args.torchrun else []) + (["--image", image] if image else [])
        seen = one_run(args.mesh, world_size, extra)
        done[image].append(seen["step 1"])
        print(f"| {i + 1} | {image or 'built'} | {load:.1f} | " + " | ".join(f"{seen[m]:.1f}" for m in MILESTONES)
              + " |", flush=True)
    for image, times in done.items():
        print(f"median step 1 done ({image or 'the built image'}): {statistics.median(times):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
