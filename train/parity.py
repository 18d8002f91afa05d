"""Parity check: a mesh run (local processes, no Docker) against the single-process reference.

    python -m train.parity --mesh 2x2x2 --schedule 1f1b --steps 10
    python -m train.parity --mesh 2x2x2 --config my_run.yaml --tolerance 1e-4

Spawns the mesh with torchrun (``--standalone``), runs ``train.reference`` with the same seed,
data and optimizer, prints a table of each step's loss and grad norm, and ends with one line
``max_rel_loss_diff=<float>``. Exits 1 when a step's relative loss difference exceeds the
tolerance (1e-4 over all steps, 1e-6 on the first step), 2 on a bad config.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from simcluster.train.cli import add_config_args, config_from_args
from simcluster.train.config import ConfigError
from simcluster.launcher.observe.rundir import read_metrics
from simcluster.train.preflight import preflight

PARITY_DEFAULTS = {"model": "tiny", "steps": 10, "val_every": 0, "log_every": 1}


def rel(a: float, b: float) -> float:
    """|a - b| / |b| (absolute difference when b is 0)."""
    return abs(a - b) / abs(b) if b else abs(a - b)


def compare(mesh_recs: list[dict], ref_recs: list[dict]) -> list[dict]:
    """Per-step rows: step, both losses and grad norms, and their relative differences.

    Raises:
        ValueError: the runs do not hold the same steps.
    """
    if [r["step"] for r in mesh_recs] != [r["step"] for r in ref_recs]:
        raise ValueError(f"step mismatch: mesh has {len(mesh_recs)} steps, reference {len(ref_recs)}")
    return [{"step": m["step"], "loss": m["loss"], "ref_loss": r["loss"], "rel_loss": rel(m["loss"], r["loss"]),
             "grad_norm": m["grad_norm"], "ref_grad_norm": r["grad_norm"],
             "rel_grad_norm": rel(m["grad_norm"], r["grad_norm"])} for m, r in zip(mesh_recs, ref_recs)]


def torchrun_cmd(world_size: int, train_args: list[str]) -> list[str]:
    """The command that runs ``python -m train`` on ``world_size`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "-m", "simcluster.train", *train_args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max relative loss difference (default 1e-4)")
    parser.add_argument("--first-step-tolerance", type=float, default=1e-6, help="on step 1 (default 1e-6)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the mesh run is killed")
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
    cmd = torchrun_cmd(run.mesh.world_size, [*flags, f"--run-dir={mesh_dir}"])
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
    rows = compare(read_metrics(mesh_dir), run_reference(run, os.path.join(run_dir, "reference")))
    print(f"{'step':>5} {'loss':>12} {'ref_loss':>12} {'rel_diff':>9} {'grad_norm':>11} {'ref_norm':>11} {'rel_diff':>9}")
    for r in rows:
        print(f"{r['step']:>5} {r['loss']:>12.7f} {r['ref_loss']:>12.7f} {r['rel_loss']:>9.1e} "
              f"{r['grad_norm']:>11.6f} {r['ref_grad_norm']:>11.6f} {r['rel_grad_norm']:>9.1e}")
    worst = max(r["rel_loss"] for r in rows)
    ok = worst <= args.tolerance and rows[0]["rel_loss"] <= args.first_step_tolerance
    print(f"max_rel_grad_norm_diff={max(r['rel_grad_norm'] for r in rows):.3e}")
    print(f"max_rel_loss_diff={worst:.3e}")
    if not ok:
        print(f"error: parity failed: tolerance {args.tolerance:g} (first step {args.first_step_tolerance:g})",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
