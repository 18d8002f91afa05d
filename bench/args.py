"""The benchmarks' own arguments, checked before anything starts: numbers in range, and the flags
they pass on to `launcher up` checked as `launcher up` checks them.

    python -c "from bench.args import positive; print(positive(int)('3'))"

A benchmark is part of the product: a bad argument exits 2 with a message naming the flag, the
value and a valid example, and nothing is started, written or left behind (no cluster, no temp
folder), as for `launcher` itself.
"""
from __future__ import annotations

import argparse
import math

from simcluster.core.errors import ConfigError


def positive(kind=int, zero: bool = False):
    """An argparse ``type=``: text -> a finite number of ``kind`` (int or float) > 0 (>= 0 with zero);
    else argparse's exit 2 naming the value and the rule."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an int' if kind is int else 'a number'}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {'>= 0' if zero else '> 0'}")
        return value

    parse.__name__ = f"{'non-negative' if zero else 'positive'} {kind.__name__}"
    return parse


def check_up_flags(flags: list[str]) -> None:
    """``launcher up``'s flags (as a benchmark passes them on) parsed and resolved as `up` does, starting
    nothing.

    Raises:
        ConfigError: an unknown flag or a bad value, with `up`'s own message.
    """
    from simcluster.launcher.job.files import container_user
    from simcluster.launcher.job.options import resolve, split_job_argv
    from simcluster.launcher.job.request import request_from_cli
    from simcluster.launcher.parser import build_parser

    own, job_argv = split_job_argv(["up", *flags])
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    if unknown:
        raise ConfigError(f"unrecognized arguments for launcher up: {' '.join(unknown)}; pass only `launcher up` "
                          f"flags, e.g. --cpus-per-node 2")
    args.job_argv = job_argv
    resolve(request_from_cli(vars(args)), user=container_user())
