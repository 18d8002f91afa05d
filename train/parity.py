"""Parity check: a mesh run (local processes, no Docker) against the single-process reference.

    python -m train.parity --mesh 2x2x2 --schedule 1f1b --steps 10
    python -m train.parity --mesh 2x2x2 --config my_run.yaml --tolerance 1e-4

Spawns the mesh with torchrun (``--standalone``; ``--launcher forkrun``: the ranks forked after one
import, as on the cluster's nodes), runs ``train.reference`` with the same seed,
data and optimizer, prints a table of each step's loss and grad norm, and ends with one line
``max_rel_loss_diff=<float>``. Exits 1 when a step's relative loss difference exceeds the
tolerance (1e-4 over all steps, 1e-6 on the first step) or the runs hold different steps, 2 on a
bad config. The step-by-step comparison and its table are launcher/observe/series.py's, the one
``launcher compare`` uses.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile

from simcluster.train.cli import add_config_args, config_from_args
from simcluster.train.config import ConfigError
from simcluster.launcher.observe.rundir import read_metrics
from simcluster.launcher.observe.series import Comparison, compare_series, series_from_rows, table_text
from simcluster.train.preflight import preflight

PARITY_DEFAULTS = {"model": "tiny", "steps": 10, "val_every": 0, "log_every": 1}


def compare(mesh_recs: list[dict], ref_recs: list[dict], tolerance: float) -> tuple[Comparison, Comparison]:
    """(loss, grad norm) of the mesh run against the reference, step by step (observe/series.py);
    the loss within ``tolerance``, the grad norm shown only (its tolerance is infinite)."""
    loss = compare_series(series_from_rows(mesh_recs, "loss"), series_from_rows(ref_recs, "loss"), tolerance, "loss",
                          ("loss", "ref_loss"))
    norm = compare_series(series_from_rows(mesh_recs, "grad_norm"), series_from_rows(ref_recs, "grad_norm"), math.inf,
                          "grad_norm", ("grad_norm", "ref_norm"))
    return loss, norm


LAUNCHERS = {"torchrun": "torch.distributed.run", "forkrun": "simcluster.launcher.container.forkrun"}


def torchrun_cmd(world_size: int, train_args: list[str], launcher: str = "torchrun") -> list[str]:
    """The command that runs ``python -m train`` on ``world_size`` local processes: under torchrun,
    or under forkrun (torchrun's agent, the ranks forked after one import, as the cluster's nodes run them)."""
    return [sys.executable, "-m", LAUNCHERS[launcher], "--standalone", f"--nproc-per-node={world_size}",
            "-m", "simcluster.train", *train_args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max relative loss difference (default 1e-4)")
    parser.add_argument("--first-step-tolerance", type=float, default=1e-6, help="on step 1 (default 1e-6)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the mesh run is killed")
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="torchrun",
                        help="how the mesh's ranks start: torchrun (default), or forkrun: torchrun's agent forking "
                             "the ranks after one import of torch (as the cluster's nodes do; ~2.7 s of CPU less a rank)")
    args = parser.parse_args(argv)
    for k, v in PARITY_DEFAULTS.items():
        if getattr(args, k) is None and not args.config:
            setattr(args, k, v)
    try:
        run = preflight(config_from_args(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="parity-")
    mesh_dir = os.path.join(run_dir, "mesh")
    cfg = run.config
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.to_dict().items() if v is not None and k != "run_dir"]
    cmd = torchrun_cmd(run.mesh.world_size, [*flags, f"--run-dir={mesh_dir}"], args.launcher)
    print(f"[parity] mesh {cfg.mesh} schedule {cfg.schedule} microbatches {cfg.microbatches}: {' '.join(cmd[1:])}",
          flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        proc = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        print(f"error: mesh run exceeded --timeout {args.timeout:.0f}s", file=sys.stderr)
        return 1
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        print(f"error: mesh run failed with exit code {proc.returncode}", file=sys.stderr)
        return 1
    import torch

    from simcluster.train.reference import run_reference

    torch.set_num_threads(1)
    loss, norm = compare(read_metrics(mesh_dir), run_reference(run, os.path.join(run_dir, "reference")), args.tolerance)
    print(table_text([loss, norm]))
    first_ok = bool(loss.rows) and loss.rows[0].rel <= args.first_step_tolerance
    print(f"max_rel_grad_norm_diff={norm.max_rel:.3e}")
    print(f"max_rel_loss_diff={loss.max_rel:.3e}")
    if not (loss.ok and first_ok):
        why = loss.problems() or [f"step {loss.rows[0].step}: rel diff {loss.rows[0].rel:.1e} > first-step "
                                  f"tolerance {args.first_step_tolerance:g}"]
        print(f"error: parity failed: tolerance {args.tolerance:g} (first step {args.first_step_tolerance:g}): "
              + "; ".join(why), file=sys.stderr)
    return 0 if loss.ok and first_ok else 1


if __name__ == "__main__":
    sys.exit(main())
