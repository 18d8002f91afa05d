"""Throughput benchmark: the mesh against one process on the same cores, in one invocation.

    python -m bench.throughput --mesh 2x2x2 --model small --schedule 1f1b
    python -m bench.throughput --mesh 2x2x2 --model small --docker      # the mesh in the compose cluster

Alternates single-process and mesh runs (``--repeats`` each), takes the median tokens/s of the
steps after warm-up, profiles one mesh step per rank (``--profile-step``) for the time breakdown,
and ends with ``efficiency=<mesh tokens/s / single tokens/s>``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from simcluster.core.errors import ConfigError
from simcluster.core.config import parse_mesh
from simcluster.core.rundir import read_metrics

WARMUP = 2  # steps excluded from the medians (first-call caches, allocator warm-up)


def steady_tokens_per_s(recs: list[dict], skip: set[int] = frozenset()) -> float:
    """Median tokens/s over the steps after warm-up (and not in ``skip``)."""
    vals = [r["tokens_per_s"] for r in recs[WARMUP:] if r["step"] not in skip] or [r["tokens_per_s"] for r in recs]
    return statistics.median(vals)


def single_command(model: str, steps: int, threads: int, run_dir: str, extra: list[str]) -> tuple[list[str], dict]:
    """(argv, environment) of one plain process (``train.reference``) with ``threads`` intra-op threads."""
    cmd = [sys.executable, "-m", "simcluster.train.reference", f"--model={model}", f"--steps={steps}", f"--threads={threads}",
           f"--run-dir={run_dir}", *extra]
    return cmd, dict(os.environ)


def mesh_command(mesh: str, model: str, schedule: str, steps: int, threads: int, run_dir: str, extra: list[str],
                 profile_step: int = 0, docker: bool = False) -> tuple[list[str], dict]:
    """(argv, environment) of the mesh as local processes (torchrun) or, with ``docker``, the compose cluster."""
    flags = [f"--mesh={mesh}", f"--model={model}", f"--schedule={schedule}", f"--steps={steps}", "--val-every=0",
             f"--profile-step={profile_step}", *extra]
    if docker:
        return [sys.executable, "-m", "launcher", "up", *flags, f"--run-dir={run_dir}"], dict(os.environ)
    world = parse_mesh(mesh).world_size
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "train", *flags, f"--threads={threads}", f"--run-dir={run_dir}"]
    return cmd, {**os.environ, "OMP_NUM_THREADS": str(threads)}


def run_single(model: str, steps: int, threads: int, run_dir: str, extra: list[str]) -> list[dict]:
    """One plain process (``train.reference``) with ``threads`` intra-op threads; its metrics records."""
    cmd, env = single_command(model, steps, threads, run_dir, extra)
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return read_metrics(run_dir)


def run_mesh(mesh: str, model: str, schedule: str, steps: int, threads: int, run_dir: str, extra: list[str],
             profile_step: int = 0, docker: bool = False) -> list[dict]:
    """The mesh as local processes (torchrun) or, with ``docker``, as the compose cluster; its metrics records."""
    cmd, env = mesh_command(mesh, model, schedule, steps, threads, run_dir, extra, profile_step, docker)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"mesh run failed ({proc.returncode}): {' '.join(cmd)}")
    return read_metrics(run_dir)


def profile_table(run_dir: str) -> dict[str, float]:
    """Mean over ranks of each category's seconds in the profiled step."""
    folder = os.path.join(run_dir, "profile")
    ranks = [json.load(open(os.path.join(folder, f))) for f in sorted(os.listdir(folder))]
    return {k: statistics.mean(r[k] for r in ranks) for k in ranks[0]}


def measure(mesh: str, model: str, schedule: str, steps: int, repeats: int, cores: int, docker: bool,
            extra: list[str], out: str) -> dict:
    """Alternate single and mesh runs; returns medians, per-repeat figures, breakdown and RSS."""
    world = parse_mesh(mesh).world_size
    threads = max(1, cores // world)
    single, meshed, rss, breakdown = [], [], [], {}
    for r in range(repeats):
        single.append(steady_tokens_per_s(run_single(model, steps, cores, f"{out}/single-{r}", extra)))
        last = r == repeats - 1
        pstep = steps if last else 0
        recs = run_mesh(mesh, model, schedule, steps, threads, f"{out}/mesh-{r}", extra, pstep, docker)
        meshed.append(steady_tokens_per_s(recs, skip={pstep}))
        rss = [max(vals) for vals in zip(*(rec["rss_mb"] for rec in recs))]
        if last:
            breakdown = profile_table(f"{out}/mesh-{r}")
        print(f"[bench] repeat {r + 1}/{repeats}: single {single[-1]:.0f} tokens/s, mesh {meshed[-1]:.0f} tokens/s",
              flush=True)
    return {"single": statistics.median(single), "mesh": statistics.median(meshed), "single_all": single,
            "mesh_all": meshed, "rss_mb": rss, "breakdown": breakdown, "threads_per_rank": threads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", default="2x2x2")
    p.add_argument("--model", default="small")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--steps", type=int, default=6, help="steps per run; the first 2 are warm-up")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cores", type=int, default=os.cpu_count(), help="cores shared by all ranks (default: all)")
    p.add_argument("--docker", action="store_true", help="run the mesh in the compose cluster")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temp folder)")
    args, extra = p.parse_known_args(argv)
    try:
        parse_mesh(args.mesh)
    except ConfigError as e:
        p.error(str(e))
    out = args.out or tempfile.mkdtemp(prefix="bench-")
    res = measure(args.mesh, args.model, args.schedule, args.steps, args.repeats, args.cores, args.docker, extra, out)
    print(f"\nmesh {args.mesh} ({'docker' if args.docker else 'local processes'}), model {args.model}, "
          f"schedule {args.schedule}, {res['threads_per_rank']} thread(s) per rank, {args.cores} cores")
    print(f"single process: {res['single']:.0f} tokens/s (median of {[round(x) for x in res['single_all']]})")
    print(f"mesh:           {res['mesh']:.0f} tokens/s (median of {[round(x) for x in res['mesh_all']]})")
    print("time per step on the mesh (mean over ranks, s):")
    for k, v in res["breakdown"].items():
        print(f"  {k:<22} {v:8.3f}")
    print("peak RSS per rank (MB): " + " ".join(f"{x:.0f}" for x in res["rss_mb"]))
    print(f"efficiency={res['mesh'] / res['single']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
