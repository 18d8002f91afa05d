"""The main job before and after an image change that adds a package: the same losses, step by step.

    python -m bench.image_change --image simcluster/trainer:latest --steps 100

Builds ``IMAGE-plus`` FROM the image with one more package (python3.11-dev, from Debian) and a module
dropped into the standard library's folder (as a distribution's package may: the listing of that
folder was the default corpus before it was pinned, train/corpus.py), then runs the main job
(``launcher up --mesh 2x2x2``: the small model on the default corpus) on each image, one after the
other, and prints each run's final loss, its data identity (RUN_DIR/data.json) and the largest
difference of the two runs' losses at any step. Exit 0 when the losses are equal at every step.
Minutes of a loaded machine: BENCHMARKS.md ("The main job across an image change") has a run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from simcluster.launcher.docker.images import build_image
from simcluster.core.rundir import read_metrics
from simcluster.core.runlog import read_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUS = """FROM {image}
USER root
RUN apt-get update -q -o Acquire::Retries=3 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \\
    --no-install-recommends python3.11-dev && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \\
 && echo 'VENDOR = 1  # a module a distribution drops into the standard library folder' \\
      > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/vendor_added.py"
USER 1000:1000
"""


def build_plus(image: str) -> str:
    """IMAGE-plus (a tag beside the image's): the image with the extra package; its name."""
    tag = image.rsplit(":", 1)[0] + ":" + (image.rsplit(":", 1)[1] if ":" in image else "latest") + "-plus"
    with tempfile.TemporaryDirectory(prefix="simcluster-plus-") as ctx:
        with open(os.path.join(ctx, "Dockerfile"), "w", encoding="utf-8") as fh:
            fh.write(PLUS.format(image=image))
        build_image(ctx, tag)
    return tag


def main_job(image: str, run_dir: str, steps: int) -> dict:
    """One main job on the image: {wall_s, load, losses: {step: loss}, data}."""
    t0, load = time.monotonic(), os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "launcher", "up", "--mesh", "2x2x2", "--steps", str(steps), "--image", image,
                    "--run-dir", run_dir, "--quiet", "--progress-every", "60"], cwd=ROOT, check=True)
    rows = read_metrics(os.path.join(ROOT, run_dir))
    data = read_data(os.path.join(ROOT, run_dir))
    return {"wall_s": round(time.monotonic() - t0, 1), "load": load, "data": data,
            "losses": {r["step"]: r["loss"] for r in rows if "loss" in r}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.image_change", description=__doc__.splitlines()[0])
    p.add_argument("--image", default="simcluster/trainer:latest", help="the trainer image (built)")
    p.add_argument("--steps", type=int, default=100, help="the main job's steps (default 100)")
    args = p.parse_args(argv)
    runs = {}
    for image in (args.image, build_plus(args.image)):
        runs[image] = main_job(image, "runs/image-change-" + image.rsplit(":", 1)[-1], args.steps)
        r = runs[image]
        last = max(r["losses"])
        print(f"{image}: final loss {r['losses'][last]:.4f} after {last} steps, data {r['data']['name']} "
              f"sha256 {r['data']['sha256_head'][:12]}, wall {r['wall_s']} s, load {r['load']:.1f} at its start")
    a, b = runs.values()
    common = sorted(set(a["losses"]) & set(b["losses"]))
    diff = max(abs(a["losses"][s] - b["losses"][s]) for s in common)
    print(f"largest loss difference over {len(common)} steps: {diff:g}")
    return 0 if diff == 0 and len(common) == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
