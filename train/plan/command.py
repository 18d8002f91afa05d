"""`launcher plan`: the namespace the launcher parsed, planned, printed. Exit 0; ConfigError (exit 2) on bad input.

    python -m launcher plan --mesh 2x2x2 --model small [--schedule 1f1b] [--hardware h100-sxm-8x] [--json]
    python -m launcher plan --search --world-size 8 --model small [--hardware local] [--memory-per-rank 0.5]
    python -m launcher project RUN_DIR --hardware h100-sxm-8x [--inter-node-bandwidth 50mbit] [--json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from simcluster.core.flags import config_from_args
from simcluster.core.errors import ConfigError
from simcluster.train.plan import search as searching
from simcluster.train.plan import project as projecting
from simcluster.core.hardware import HARDWARE, NAMES, shaped
from simcluster.train.plan.lookup import hardware
from simcluster.train.plan.predict import plan, to_dict, to_text
from simcluster.train.plan.steptime import step_time
from simcluster.train.plan.steptime import to_text as step_text
from simcluster.train.preflight import preflight
from simcluster.core.runlog import run_folder


def run(args: argparse.Namespace) -> int:
    """Print the plan (or the search) the flags ask for.

    Raises:
        ConfigError: a config preflight refuses (its message), an unknown --hardware (the known
            ones listed), --search without --world-size or with --mesh, --memory-per-rank <= 0.
    """
    _check_hardware(args.hardware)
    limit = args.memory_per_rank
    if limit is not None and not (limit > 0 and math.isfinite(limit)):
        raise ConfigError(f"memory_per_rank: must be a finite number > 0 GB, got {limit}; e.g. --memory-per-rank 80")
    if not args.search and args.world_size is not None:
        raise ConfigError(f"world_size: --world-size {args.world_size} is read by --search only (a plan's world is "
                          f"its --mesh); add --search to rank every mesh of it, or drop --world-size")
    used = args.hardware or ("local" if args.search else None)
    if args.recalibrate and used != "local":
        raise ConfigError(f"recalibrate: measures the `local` hardware model, but this plan uses "
                          f"{repr(used) if used else 'no hardware (no --hardware)'}; add --hardware local, or drop "
                          f"--recalibrate")
    if args.search:
        if args.world_size is None or args.world_size < 1:
            raise ConfigError("search: needs --world-size N >= 1 (the ranks to spread), e.g. --world-size 8")
        if args.world_size > searching.MAX_WORLD:
            raise ConfigError(f"world_size: --world-size {args.world_size} is beyond what the search walks (1 to "
                              f"{searching.MAX_WORLD} ranks); e.g. --world-size 8")
        if args.mesh is not None:
            raise ConfigError("search: ranks every mesh of --world-size; drop --mesh (or drop --search to plan one)")
        hw = hardware(args.hardware or "local", args.recalibrate)
        found, refused = searching.search(config_from_args(args), args.world_size, hw,
                                          None if limit is None else limit * 1e9,
                                          progress=lambda line: print(line, file=sys.stderr, flush=True))
        if not found:
            raise ConfigError(searching.none_runs(refused, args.world_size))
        if args.json:
            print(json.dumps({"hardware": hw.name, "candidates": [{**dataclasses.asdict(c), "step_s": c.step.total}
                                                                  for c in found], "refused": refused}, indent=1))
        else:
            print(searching.to_text(found, refused, hw, args.world_size, None if limit is None else limit * 1e9))
        return 0
    result = plan(preflight(config_from_args(args)))
    hw = hardware(args.hardware, args.recalibrate) if args.hardware else None
    overhead = None
    if hw and hw.shared_cores:
        from simcluster.train.plan.measure import overhead_for  # forks fake-group ranks: only for local

        overhead = overhead_for(result, hw)
    slowest = step_time(result, hw, overhead)[0] if hw else None
    if args.json:
        data = to_dict(result)
        if hw:
            data["step_time"] = {"hardware": hw.name, **dataclasses.asdict(slowest), "total": slowest.total,
                                 "sources": list(hw.sources), "overhead": list(overhead) if overhead else None}
        print(json.dumps(data, indent=1))
    else:
        print(to_text(result) + (f"\n{step_text(slowest, hw, overhead)}" if hw else ""))
    over = [r for r in result.ranks if limit is not None and r.total > limit * 1e9]
    if over:
        big = max(over, key=lambda r: r.total)
        print(f"warning: {len(over)} of {len(result.ranks)} ranks need more than --memory-per-rank {limit:g} GB "
              f"(1e9 bytes); the largest, rank {big.rank}, {big.total / 1e9:.2f} GB", file=sys.stderr)
    return 0


def _check_hardware(name: str | None) -> None:
    """--hardware given empty or blank (a shell variable unset): refused, naming the choices."""
    if name is not None and not name.strip():
        raise ConfigError(f"hardware: an empty name ({name!r}); choose one of {', '.join(NAMES)}, "
                          f"e.g. --hardware h100-sxm-8x (or drop --hardware)")
    if name is not None and name not in NAMES:
        hardware(name)  # raises, listing the known ones


def project(args: argparse.Namespace) -> int:
    """Print the projection of args.run_dir onto args.hardware (and --inter-node-bandwidth).

    Raises:
        ConfigError: a folder that is missing or lacks the records (the flags to run with), an
            unknown --hardware (the known ones listed), a bad --inter-node-bandwidth.
    """
    run_folder(args.run_dir, "project: RUN_DIR", "launcher project runs/mesh-2x2x2 --hardware h100-sxm-8x")
    _check_hardware(args.hardware)
    if args.inter_node_bandwidth is not None:
        shaped(HARDWARE[NAMES[0]], args.inter_node_bandwidth)  # its errors before any reading or calibration
    m = projecting.measured(args.run_dir)  # its errors before any calibration
    here_hw = hardware("local", args.recalibrate)  # --recalibrate: the model of here (and of a `local` target)
    target = hardware(args.hardware)
    if args.inter_node_bandwidth is not None:
        target = shaped(target, args.inter_node_bandwidth)
    if m.inter_node_bandwidth:  # measured on a shaped network: here is that network
        here_hw = shaped(here_hw, m.inter_node_bandwidth)
    here, there = projecting.project(m, here_hw, target)
    print(json.dumps(projecting.to_dict(m, here, there), indent=1) if args.json else projecting.to_text(m, here, there, target))
    return 0
