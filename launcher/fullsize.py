"""`launcher plan --full-size`: your program at its real size, nothing computed, one host process a
distinct rank; its memory as the GPU's caching allocator would report it, its step time and tokens/s.

    python -m launcher plan --full-size --script examples/fullsize/tiny.py --nodes 1 --nproc-per-node 2 --gpu h100-96g -- --steps 1 --dim 256 --layers 2
    python -m launcher plan --full-size --search --knob batch=4,8,16 --script examples/fullsize/tiny.py --nodes 1 --nproc-per-node 2 --gpu h100-96g -- --steps 1 --dim 256 --layers 2
    python -m launcher plan --full-size --mesh 2x1x1 --model tiny --microbatches 4 --steps 2 --gpu h100-96g   # the built-in trainer
    python -m launcher plan --full-size --module torchtitan.train --code DIR --nodes 1 --nproc-per-node 8 \
        --gpu h100-96g --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True --json -- --model.flavor 8B ...

Where it runs: a host process per rank run (launcher/instrument/fullsize.py), not the cluster's
containers: a rank of the full-size run needs no peer (torch's fake process group answers every
collective alone), so one process stands for a rank without the others, and the host's interpreter
(``--python``, e.g. a virtual environment holding your code's requirements) starts in a second
where a container would first need an image with them. Which ranks run (``--ranks``, default: the
first and the last rank): every other rank is stood for by the run rank at or below it, assumed
identical to it (dp and tp peers of one pipeline stage are; the table prints which rank stands for
which; ``--ranks all`` runs every one). Ranks run two at a time. ``--search --knob NAME=V1,V2,...``
plans the program once a value of its own flag ``--NAME`` and names the largest that fits.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from simcluster.launcher.instrument.spec import DEFAULT_GPU
from simcluster.launcher.fullsize_checks import EXAMPLE, check, knob as knob_of, which_ranks
from simcluster.launcher.job.env import env_pairs
from simcluster.core.errors import ConfigError
from simcluster.train.plan.fullsize.trace import NOT_THE_PROGRAM

BUILTIN = "simcluster.train"


def _trainer_flags(args: argparse.Namespace) -> list[str]:
    """The built-in trainer's flags the user set on `plan` (--config and every Config field), as its argv."""
    from dataclasses import fields

    from simcluster.core.config import Config

    out = ["--config", args.config] if getattr(args, "config", None) else []
    for f in fields(Config):
        if getattr(args, f.name, None) is not None:
            out += [f"--{f.name.replace('_', '-')}", str(getattr(args, f.name))]
    return out


def _builtin(args: argparse.Namespace) -> argparse.Namespace:
    """`plan --full-size --mesh PPxDPxTP --model ...` (a trainer flag, no --script/--module): the built-in trainer
    (``--module simcluster.train``, its flags from `plan`'s own, the cluster's layout: a node a pipeline
    stage, dp x tp ranks a node; by default the first rank of every stage and the last rank run, and its
    schedule times the pipeline). With --script/--module, the trainer's flags are refused (they go after --).

    Raises:
        ConfigError: trainer flags beside your own program; neither; --nodes x --nproc-per-node not the mesh's size.
    """
    from simcluster.core.flags import config_from_args
    from simcluster.core.config import parse_mesh, resolve
    from simcluster.core.preflight_values import value_errors

    flags = _trainer_flags(args)
    if args.script or args.module:
        if flags:
            raise ConfigError(f"full_size: {' '.join(flags[::2])} are the built-in trainer's flags, not read for your "
                              f"--script/--module; give your program's own after --, e.g. {EXAMPLE}")
        return args
    if not flags:
        raise ConfigError(f"full_size: needs your program, --script FILE or --module NAME (one of them), or the "
                          f"built-in trainer's flags (--mesh, --model...); e.g. {EXAMPLE}, or python -m launcher plan "
                          f"--full-size --mesh 2x2x2 --model tiny --gpu h100-96g")
    mesh = parse_mesh(config_from_args(args).mesh)
    nodes, per = args.nodes or mesh.pp, args.nproc_per_node or mesh.ranks_per_node
    if nodes * per != mesh.world_size:
        raise ConfigError(f"nodes/nproc_per_node: --nodes {nodes} x --nproc-per-node {per} is not the mesh {mesh}'s "
                          f"{mesh.world_size} ranks; drop them (default: {mesh.pp} nodes of {mesh.ranks_per_node}), "
                          f"e.g. python -m launcher plan --full-size --mesh {mesh} --model tiny --gpu h100-96g")
    run = resolve(config_from_args(args))
    if errors := value_errors(run.config):  # as the trainer's preflight would, before a rank starts
        raise ConfigError(f"{'; '.join(errors)} (plan --full-size --mesh {mesh}: the built-in trainer's flags)")
    ranks = args.ranks or ",".join(str(r) for r in sorted({*range(0, mesh.world_size, per), mesh.world_size - 1}))
    return argparse.Namespace(**{**vars(args), "module": BUILTIN, "nodes": nodes, "nproc_per_node": per,
                                 "job_argv": [*flags, *(args.job_argv or ())], "ranks": ranks,
                                 "pipeline": (run.config.schedule, run.local_stages, run.config.microbatches)})


def run(args: argparse.Namespace) -> int:
    """Run the ranks, replay and time them, print the table or --json. Exit 0.

    Raises:
        ConfigError: a bad flag (named, with an example), a --gpu model without the constants a prediction
            needs, a program that failed under the fake mode (its line and how to skip that part).
    """
    from simcluster.train.plan.fullsize.device import constants
    from simcluster.train.plan.fullsize.report import to_text

    args = _builtin(args)
    world, per = check(args)
    device = constants(args.gpu or DEFAULT_GPU)
    env = dict(env_pairs(tuple(args.env or ())))
    ranks = which_ranks(args.ranks, world)
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    expandable = "expandable_segments:true" in conf.replace(" ", "").lower()
    # record_stream on async collectives' tensors: torch's default before 2025, off since (memory.py)
    avoid = env.get("TORCH_NCCL_AVOID_RECORD_STREAMS", os.environ.get("TORCH_NCCL_AVOID_RECORD_STREAMS", "1"))
    alloc = (expandable, avoid.strip().lower() in ("0", "false"))
    knob = knob_of(args)
    if args.trace_dir:
        try:
            os.makedirs(args.trace_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"trace_dir: {args.trace_dir!r} cannot be made a folder ({e.strerror}); give one you can "
                              f"write, e.g. --trace-dir runs/fullsize-traces") from None
    argv = list(args.job_argv or ())
    if knob is None:
        data = _plan_once(args, argv, ranks, world, per, env, device, alloc)
        print(json.dumps(data, indent=1) if args.json else to_text(data))
        return 0
    flag, values = knob
    found = []
    for v in values:
        print(f"[full-size] search: {flag} {v}", file=sys.stderr, flush=True)
        data = _plan_once(args, _with_flag(argv, flag, v), ranks, world, per, env, device, alloc)
        found.append({"value": v, "fits": all(r["fits"] for r in data["ranks"]),
                      "device_peak_gib": max(r["device_peak_gib"] for r in data["ranks"]),
                      "tokens_per_s": min((r["tokens_per_s"] or 0) for r in data["ranks"]) or None,
                      "step_s": max((r["step_s"] or 0) for r in data["ranks"]) or None,
                      "oom_by_gib": max(r["oom_by_gib"] for r in data["ranks"]), "plan": data})
    best = [f["value"] for f in found if f["fits"]]
    out = {"knob": flag, "candidates": found, "largest_fitting": best[-1] if best else None}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"search over {flag} on {device.name} ({device.memory / 2**30:.2f} GiB a GPU):")
        for f in found:
            tps = f"{f['tokens_per_s']:,.0f} tokens/s a GPU" if f["tokens_per_s"] else \
                f"step {f['step_s']:.4f} s" if f["step_s"] else "no step timed"
            print(f"  {flag} {f['value']:<8} device peak {f['device_peak_gib']:>7.2f} GiB  "
                  f"{'fits' if f['fits'] else 'OOM by ' + format(f['oom_by_gib'], '.2f') + ' GiB':<18}  {tps}")
        print(f"largest that fits: {flag} {out['largest_fitting']}" if best else "none fits")
    return 0


def _with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with ``flag`` set to ``value`` (its ``--flag V`` or ``--flag=V`` replaced, else appended)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == flag:
            i += 2
            continue
        if not a.startswith(flag + "="):
            out.append(a)
        i += 1
    return [*out, flag, value]


def _plan_once(args, argv: list[str], ranks, world: int, per: int, env: dict, device, alloc: tuple) -> dict:
    """One full-size plan of the program with ``argv``: the ranks run, replayed (``alloc``: expandable
    segments, record_stream on async collectives), timed (to_dict's data)."""
    with tempfile.TemporaryDirectory(prefix="simcluster-fullsize-") as tmp:
        where = os.path.abspath(args.trace_dir or tmp)
        with ThreadPoolExecutor(max_workers=2) as pool:
            outs = list(pool.map(lambda r: _one_rank(args, argv, r, world, per, env, where), ranks))
        return _collect(outs, ranks, world, device, alloc, getattr(args, "pipeline", None))


def _one_rank(args, argv: list[str], rank: int, world: int, per: int, env: dict, tmp: str) -> str:
    """Start one rank's process, wait for it; the path of its trace."""
    out = os.path.join(tmp, f"trace-{rank}.json")
    what = ["--script", os.path.abspath(os.path.join(args.code or ".", args.script))] if args.script else \
        ["--module", args.module]
    cmd = [args.python or sys.executable, "-m", "simcluster.launcher.instrument.fullsize", "--rank", str(rank),
           "--world-size", str(world), "--local-world-size", str(per), "--gpu", args.gpu or DEFAULT_GPU,
           "--out", out, *what, "--", *argv]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    penv = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    print(f"[full-size] rank {rank}: {shlex.join(cmd[1:6])} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=args.code or os.getcwd(), env=penv, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(tmp, f"log-{rank}.txt"), "w") as f:
        f.write(proc.stdout)
    if not os.path.exists(out):
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        raise ConfigError(f"full_size: rank {rank}'s process ended (exit {proc.returncode}) before writing its "
                          f"trace:\n{tail}")
    return out


def _collect(outs: list[str], ranks: list[int], world: int, device, alloc: tuple,
             pipeline: tuple[str, int, int] | None = None) -> dict:
    """Read the traces, replay, time (a pipeline by ``pipeline``'s (schedule, local stages,
    microbatches): the built-in trainer's; else 1F1B assumed, said in the output; ``alloc``: replay's
    options after the trace and device): to_dict's data."""
    from simcluster.train.plan.fullsize.device import MATMUL_EFFICIENCY
    from simcluster.train.plan.fullsize.memory import replay
    from simcluster.train.plan.fullsize.report import RankResult, to_dict
    from simcluster.train.plan.fullsize.schedule import step_speeds
    from simcluster.train.plan.fullsize.trace import read

    traces, placeholders = {}, {}
    for rank, path in zip(ranks, outs):
        traces[rank] = trace = read(path)
        if trace.error:
            raise ConfigError(_failure(rank, trace.error))
        placeholders.update(trace.placeholders)
    schedule, local_stages, m = pipeline or ("1f1b", 1, None)
    speeds = step_speeds(traces, device, MATMUL_EFFICIENCY, schedule, local_stages, m)
    results = [RankResult(rank, tuple(r for r in range(world) if _stood_for_by(r, ranks) == rank),
                          replay(t, device, *alloc), speeds[rank], t.seconds, t.custom)
               for rank, t in traces.items()]
    data = to_dict(results, device, alloc[0], placeholders)
    if pipeline is None and any(s is not None and s.schedule for s in speeds.values()):
        data["unseen"].append("the pipeline's schedule: not known for your program, 1F1B's order assumed")
    return data


def _stood_for_by(rank: int, ranks: list[int]) -> int:
    """The run rank that stands for ``rank``: itself if run, else the nearest run rank at or below it
    (the first rank for the ranks before the last: dp/tp peers of one stage are alike)."""
    below = [r for r in ranks if r <= rank]
    return below[-1] if below else ranks[0]


def _failure(rank: int, error: str) -> str:
    """The message for a program that failed under the fake mode: its own line and what to do."""
    lines = error.strip().splitlines()
    own = [ln.strip() for ln in lines if ln.strip().startswith("File ")
           and not any(part in ln for part in (*NOT_THE_PROGRAM, "<frozen"))]
    where = own[-1] if own else "(no line of your program in the traceback)"
    return (f"full_size: rank {rank}'s program failed under the fake mode at {where}: {lines[-1]}\n"
            f"A full-size run has tensors without data: a part that reads or writes their values (a checkpoint "
            f"save, an evaluation, a data-dependent branch) must be skipped by the program's own switch for the "
            f"plan (e.g. torchtitan: drop --checkpoint.enable; a save or eval interval beyond the plan's steps)")
