"""Entry point: ``python -m train`` (one process) or under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

    torchrun --nproc-per-node 8 -m train --mesh 2x2x2 --model small --data ../shared/data/tinyshakespeare.txt --steps 300

Exit codes: 0 done; 2 a config, data or checkpoint that cannot run (every problem listed, before
any process group or file exists; a checkpoint DCP cannot read, after); 3 the loss or grad norm
became nan or inf (the step's metrics row is written first); other non-zero: a crash.
"""
from __future__ import annotations

import argparse
import os
import sys

from simcluster.core.flags import add_config_args, config_from_args
from simcluster.core.errors import ConfigError
from simcluster.train.preflight import preflight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = preflight(config_from_args(args), world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from simcluster.train.trainer import run  # torch is imported only once the config is known to be good

    return run(cfg)


def exit_now(code: int) -> None:
    """End a fresh interpreter's rank whose run is over (every file closed, the process group destroyed)
    with its exit code and no interpreter teardown: no gloo C++ thread can then outlive the interpreter
    and abort the rank at exit ('terminate called without an active exception', SIGABRT, after its last
    step). A forked rank (train/forked_rank.py) returns instead: its agent collects its result, and its
    process already ends without teardown (multiprocessing's os._exit)."""
    if "simcluster.train.forked_rank" in sys.modules:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
