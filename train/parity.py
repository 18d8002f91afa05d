"""Parity check: a mesh run (local processes, no Docker) against the single-process reference.

    python -m train.parity --mesh 2x2x2 --schedule 1f1b --steps 10
    python -m train.parity --mesh 2x2x2 --config my_run.yaml --tolerance 1e-4
    python -m train.parity --mesh 1x2x2,2x2x2 --schedule gpipe,1f1b --steps 3   # every pair, one command

Spawns the mesh with torchrun (``--standalone``; ``--launcher forkrun``: torchrun's agent forked from
this process and the ranks from the agent's one-thread fork server, after this process's one
import of torch and the trainer, as on the cluster's nodes), runs ``train.reference`` with the
same seed, data and optimizer, prints a table of each step's loss and grad norm, and ends with one line
``max_rel_loss_diff=<float>``. Exits 1 when a step's relative loss difference exceeds the
tolerance (1e-4 over all steps, 1e-6 on the first step) or the runs hold different steps, 2 on a
bad config. The step-by-step comparison and its table are simcluster/core/series.py's, the one
``launcher compare`` uses.

Lists: ``--mesh`` and ``--schedule`` take comma-separated lists, and the tool checks every pair
of their cross product, parsed and preflighted before any run (a bad pair exits 2, naming it).
All mesh runs come first, each in FOLDER = RUN_DIR/MESH-SCHEDULE (forked from this process under
forkrun, which needs it to have run no tensor op yet), then each pair's reference and table. It
ends with ``parity: K/N pairs passed`` and one ``parity: mesh M schedule S: ok`` (or ``FAILED:
why``) line a pair, and exits 1 when any pair failed. One pair gives the output above, with its
folders directly in RUN_DIR. Why a list: the tool's own import of torch and the trainer (about
4 s of CPU on 2 cores) is made once for all pairs.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile

from simcluster.core.flags import add_config_args, config_from_args
from simcluster.core.errors import ConfigError
from simcluster.core.config import TrainRun
from simcluster.core.rundir import read_metrics
from simcluster.core.series import Comparison, compare_series, series_from_rows, table_text
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


LAUNCHERS = {"torchrun": "torch.distributed.run", "forkrun": "simcluster.train.forkrun"}


def torchrun_args(world_size: int, train_args: list[str]) -> list[str]:
    """torchrun's arguments (torchrun's and forkrun's alike) that run ``python -m train`` on
    ``world_size`` local processes."""
    return ["--standalone", f"--nproc-per-node={world_size}", "-m", "simcluster.train", *train_args]


def run_mesh(launcher: str, args: list[str], env: dict[str, str], timeout: float, log_path: str,
             ) -> tuple[int | None, str]:
    """Run ``launcher`` (a LAUNCHERS key) with torchrun's arguments ``args`` (``torchrun_args``) to
    its end: (its exit code, None past ``timeout`` seconds (killed); its stdout and stderr, also
    kept in ``log_path``). Under forkrun the agent is forked from this process
    (``forkrun.spawn``: the trainer imported here once, where a fresh interpreter would import
    torch and the trainer again, about 3 s of CPU a run); this process runs no tensor op and
    starts no thread before it (the reference comes after), as a fork needs."""
    if launcher != "forkrun":
        try:
            proc = subprocess.run([sys.executable, "-m", LAUNCHERS[launcher], *args], env=env, timeout=timeout,
                                  capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return None, ""
        with open(log_path, "w", encoding="utf-8") as fh:
            fh.write(proc.stdout + proc.stderr)
        return proc.returncode, proc.stdout + proc.stderr
    import time

    from simcluster.train import forkrun

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w", encoding="utf-8") as log:  # the agent's and ranks' output: the log, not ours
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            agent = forkrun.spawn(args, env)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    agent.start()
    deadline = time.monotonic() + timeout
    try:
        while agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        timed_out = agent.poll() is None  # past the timeout, or this process interrupted
        if timed_out:
            agent.kill()
            os.waitpid(agent.pid, 0)
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        return None if timed_out else agent.returncode, fh.read()


def plan_pairs(args: argparse.Namespace) -> list[TrainRun]:
    """One preflighted TrainRun per (mesh, schedule) of the cross product of ``args.mesh`` and
    ``args.schedule`` (each a comma-separated list, or unset: the config's or the default), in
    that order. Parses everything before any run starts.

    Raises:
        ConfigError: a list holds an empty or repeated item, or a pair is not a valid run; the
            message names the pair.
    """
    lists = {}
    for name in ("mesh", "schedule"):
        value = getattr(args, name)
        items = [x.strip() for x in value.split(",")] if value is not None else [None]
        if "" in items or len(set(items)) != len(items):
            raise ConfigError(f"{name}: give one value or a comma-separated list without blanks or repeats, e.g. "
                              f"--mesh 1x2x2,2x2x2 --schedule gpipe,1f1b; got {value!r}")
        lists[name] = items
    runs = []
    for mesh in lists["mesh"]:
        for schedule in lists["schedule"]:
            one = argparse.Namespace(**{**vars(args), "mesh": mesh, "schedule": schedule})
            try:
                runs.append(preflight(config_from_args(one)))
            except ConfigError as e:
                if len(lists["mesh"]) * len(lists["schedule"]) == 1:
                    raise
                raise ConfigError(f"mesh {mesh or 'default'} schedule {schedule or 'default'}: {e}") from None
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max relative loss difference (default 1e-4)")
    parser.add_argument("--first-step-tolerance", type=float, default=1e-6, help="on step 1 (default 1e-6)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a mesh run is killed")
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="torchrun",
                        help="how the mesh's ranks start: torchrun (default), or forkrun: torchrun's agent forking "
                             "the ranks after one import of torch (as the cluster's nodes do; ~2.7 s of CPU less a rank)")
    args = parser.parse_args(argv)
    for k, v in PARITY_DEFAULTS.items():
        if getattr(args, k) is None and not args.config:
            setattr(args, k, v)
    try:
        runs = plan_pairs(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="parity-")
    single = len(runs) == 1
    folders = [run_dir if single else os.path.join(run_dir, f"{r.config.mesh}-{r.config.schedule}")
               for r in runs]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    failed: dict[int, str] = {}
    for i, (run, folder) in enumerate(zip(runs, folders)):  # every mesh before any tensor op here (forks)
        failed_why = run_one_mesh(run, folder, args, env)
        if failed_why:
            failed[i] = failed_why
    import torch

    torch.set_num_threads(1)
    verdicts = []
    for i, (run, folder) in enumerate(zip(runs, folders)):
        cfg = run.config
        if i in failed:
            verdicts.append((cfg, False, failed[i]))
            continue
        if not single:
            print(f"[parity] mesh {cfg.mesh} schedule {cfg.schedule}: against one process", flush=True)
        ok, why = check_against_reference(run, folder, args)
        verdicts.append((cfg, ok, why))
    if not single:
        print(f"parity: {sum(ok for _, ok, _ in verdicts)}/{len(verdicts)} pairs passed")
        for cfg, ok, why in verdicts:
            print(f"parity: mesh {cfg.mesh} schedule {cfg.schedule}: {'ok' if ok else 'FAILED: ' + why}")
    return 0 if all(ok for _, ok, _ in verdicts) else 1


def run_one_mesh(run: TrainRun, folder: str, args: argparse.Namespace, env: dict[str, str]) -> str | None:
    """Run ``run``'s mesh into FOLDER/mesh (its log FOLDER/mesh.log); None when it exited 0, else
    why not (printed to stderr with the run's output tail)."""
    cfg = run.config
    mesh_dir = os.path.join(folder, "mesh")
    os.makedirs(folder, exist_ok=True)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.to_dict().items() if v is not None and k != "run_dir"]
    mesh_args = torchrun_args(run.mesh.world_size, [*flags, f"--run-dir={mesh_dir}"])
    print(f"[parity] mesh {cfg.mesh} schedule {cfg.schedule} microbatches {cfg.microbatches}: "
          f"-m {LAUNCHERS[args.launcher]} {' '.join(mesh_args)}", flush=True)
    code, output = run_mesh(args.launcher, mesh_args, env, args.timeout, os.path.join(folder, "mesh.log"))
    if code is None:
        why = f"mesh run exceeded --timeout {args.timeout:.0f}s"
    elif code != 0:
        sys.stderr.write(output[-12000:])
        why = f"mesh run failed with exit code {code}"
    else:
        return None
    print(f"error: mesh {cfg.mesh} schedule {cfg.schedule}: {why}", file=sys.stderr, flush=True)
    return why


def check_against_reference(run: TrainRun, folder: str, args: argparse.Namespace) -> tuple[bool, str]:
    """Train the reference of ``run`` in this process (FOLDER/reference), print the step table and
    the max_rel lines; (passed, why not)."""
    from simcluster.train.reference import run_reference

    reference = run_reference(run, os.path.join(folder, "reference"))
    loss, norm = compare(read_metrics(os.path.join(folder, "mesh")), reference, args.tolerance)
    print(table_text([loss, norm]))
    first_ok = bool(loss.rows) and loss.rows[0].rel <= args.first_step_tolerance
    print(f"max_rel_grad_norm_diff={norm.max_rel:.3e}")
    print(f"max_rel_loss_diff={loss.max_rel:.3e}", flush=True)
    if loss.ok and first_ok:
        return True, ""
    why = loss.problems() or [f"step {loss.rows[0].step}: rel diff {loss.rows[0].rel:.1e} > first-step "
                              f"tolerance {args.first_step_tolerance:g}"]
    print(f"error: parity failed: tolerance {args.tolerance:g} (first step {args.first_step_tolerance:g}): "
          + "; ".join(why), file=sys.stderr, flush=True)
    return False, "; ".join(why)


if __name__ == "__main__":
    sys.exit(main())
