"""`launcher plan`: the namespace the launcher parsed, planned, printed. Exit 0; ConfigError (exit 2) on bad input.

    python -m launcher plan --mesh 2x2x2 --model small [--schedule 1f1b] [--hardware h100-sxm-8x] [--json]
    python -m launcher plan --search --world-size 8 --model small [--hardware local] [--memory-per-rank 0.5]
    python -m launcher project RUN_DIR --hardware h100-sxm-8x [--inter-node-bandwidth 50mbit] [--json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from simcluster.train.cli import config_from_args
from simcluster.train.errors import ConfigError
from simcluster.train.plan import search as searching
from simcluster.train.plan import project as projecting
from simcluster.train.plan.hardware import NAMES, shaped
from simcluster.train.plan.lookup import hardware
from simcluster.train.plan.predict import plan, to_dict, to_text
from simcluster.train.plan.steptime import step_time
from simcluster.train.plan.steptime import to_text as step_text
from simcluster.train.preflight import preflight


def run(args: argparse.Namespace) -> int:
    """Print the plan (or the search) the flags ask for.

    Raises:
        ConfigError: a config preflight refuses (its message), an unknown --hardware (the known
            ones listed), --search without --world-size or with --mesh, --memory-per-rank <= 0.
    """
    limit = args.memory_per_rank
    if limit is not None and not limit > 0:
        raise ConfigError(f"memory_per_rank: must be > 0 GB, got {limit}; e.g. --memory-per-rank 80")
    if args.search:
        if args.world_size is None or args.world_size < 1:
            raise ConfigError("search: needs --world-size N >= 1 (the ranks to spread), e.g. --world-size 8")
        if args.mesh is not None:
            raise ConfigError("search: ranks every mesh of --world-size; drop --mesh (or drop --search to plan one)")
        hw = hardware(args.hardware or "local", args.recalibrate)
        found, refused = searching.search(config_from_args(args), args.world_size, hw,
                                          None if limit is None else limit * 1e9,
                                          progress=lambda line: print(line, file=sys.stderr, flush=True))
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
              f"(1e9 bytes); the largest, rank {big.rank}, {big.total / 1e9:.2f} GB")
    return 0


def project(args: argparse.Namespace) -> int:
    """Print the projection of args.run_dir onto args.hardware (and --inter-node-bandwidth).

    Raises:
        ConfigError: a folder that is missing or lacks the records (the flags to run with), an
            unknown --hardware (the known ones listed), a bad --inter-node-bandwidth.
    """
    if not os.path.isdir(args.run_dir):
        raise ConfigError(f"project: {args.run_dir} is not a folder; pass a run folder, e.g. runs/mesh-2x2x2")
    if args.hardware not in NAMES:
        hardware(args.hardware)  # raises, listing the known ones
    m = projecting.measured(args.run_dir)  # its errors before any calibration
    target = hardware(args.hardware, args.recalibrate)
    if args.inter_node_bandwidth is not None:
        target = shaped(target, args.inter_node_bandwidth)
    here_hw = hardware("local")
    if m.inter_node_bandwidth:  # measured on a shaped network: here is that network
        here_hw = shaped(here_hw, m.inter_node_bandwidth)
    here, there = projecting.project(m, here_hw, target)
    print(json.dumps(projecting.to_dict(m, here, there), indent=1) if args.json else projecting.to_text(m, here, there, target))
    return 0
