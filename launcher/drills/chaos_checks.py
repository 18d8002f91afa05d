"""The inputs of ``launcher chaos`` refused before it waits: the fault's own arguments, a step after
the run's last, and a compose file written by ``generate`` (never a run of ``up``, so nothing to wait for).

    python -m launcher chaos --kill node-9 --at-step 1 --file docker-compose.yml   # exits 2: no such service

Split from launcher/drills/chaos.py (which waits and applies the fault) by concern.
"""
from __future__ import annotations

import os

from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.docker.compose_cli import compose
from simcluster.launcher.docker.handle import sanitize_project
from simcluster.launcher.job.sections import MAX_NODES, MAX_RANKS, MAX_STEPS, TIMER_LIMIT_S
from simcluster.core.errors import ConfigError
from simcluster.core.runlog import read_job

FAULTS = ("kill", "stop", "pause", "disconnect", "freeze")
RUN_RECORDS = ("job.json", "compose.yml", "stack.yml", "cluster.log")  # what `up` leaves in a run folder


def check_args(kind: str, node: str, at_step: int, wait_s: float, run_dir: str | None) -> None:
    """The fault's own inputs, before anything waits.

    Raises:
        ConfigError: an unknown kind, a step or a --wait-s out of range (check_wait), a rank that is no
            number or beyond any simulated cluster (freeze), an empty node name, a --run-dir that is a file.
    """
    if kind not in FAULTS:
        raise ConfigError(f"chaos: unknown fault {kind!r}; choose one of {', '.join(FAULTS)}")
    check_wait(at_step, wait_s)
    if kind == "freeze" and not (str(node).isascii() and str(node).isdigit()):
        raise ConfigError(f"freeze: --freeze {node} is not a global rank (an integer >= 0); e.g. --freeze 1")
    if kind == "freeze" and int(node) >= MAX_NODES * MAX_RANKS:
        raise ConfigError(f"freeze: --freeze {node} is a rank no simulated cluster has (ranks 0 to "
                          f"{MAX_NODES * MAX_RANKS - 1}: {MAX_NODES} nodes of {MAX_RANKS}); e.g. --freeze 1")
    if kind != "freeze" and not str(node).strip():
        raise ConfigError(f"{kind}: --{kind} {node!r} names no node; e.g. --{kind} node-1")
    if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"--run-dir {run_dir}: a file, not a folder; pass the run folder of `launcher up`, "
                          f"e.g. --run-dir runs/mesh-2x2x2")


def check_wait(at_step: int, wait_s: float) -> None:
    """--at-step and --wait-s of any fault (a node's or a host's), before anything waits: a step a run can
    reach (1 to MAX_STEPS) and a wait a timer holds (above 0, at most TIMER_LIMIT_S).

    Raises:
        ConfigError: naming the flag, the value and the range.
    """
    if isinstance(at_step, bool) or not isinstance(at_step, int) or not 1 <= at_step <= MAX_STEPS:
        raise ConfigError(f"at_step: --at-step {at_step!r} is not a step a run reaches (steps count from 1, the first "
                          f"finished step, to {MAX_STEPS}); e.g. --at-step 5")
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not (0 < wait_s <= TIMER_LIMIT_S):
        raise ConfigError(f"wait_s: --wait-s {wait_s!r} must be a number of seconds above 0 and at most "
                          f"{TIMER_LIMIT_S:g}; e.g. --wait-s 600")


def check_step(at_step: int, run_dir: str | None, flag: str) -> None:
    """Refuse at once a step after the run's last, where its record knows it (RUN_DIR/job.json "steps").

    flag: the fault's flag and value for the example (``--kill node-1``).

    Raises:
        ConfigError: at_step is after the last step, naming both and a valid step.
    """
    job = read_job(run_dir) if run_dir else None
    last = job.get("steps") if job else None
    if last is not None and at_step > last:
        raise ConfigError(f"at_step: --at-step {at_step} is after the last step ({last}) of the run in {run_dir}: it "
                          f"would never be reached; e.g. {flag} --at-step {last}")


def check_generated(kind: str, node: str, run_dir: str | None, file: str | None, project: str | None) -> None:
    """A compose file of ``generate``, refused before any wait: a --run-dir folder that holds YAML
    files but none of a run's records (RUN_RECORDS: `up` writes job.json before anything starts),
    and, with --file, a node that is none of the file's services (the Compose CLI lists them:
    ``config --services``; a file Compose cannot read is left to the run).

    Raises:
        ConfigError: naming the folder's files and --file, or the file's nodes.
    """
    if run_dir and os.path.isdir(run_dir) and not any(os.path.exists(os.path.join(run_dir, f)) for f in RUN_RECORDS):
        files = sorted(f for f in os.listdir(run_dir) if f.endswith((".yml", ".yaml")))
        if files:
            raise ConfigError(f"--run-dir {run_dir}: holds {', '.join(files)} but no job.json or compose.yml: not a run "
                              f"folder of `python -m launcher up` (a file written by `generate`?), so no run will "
                              f"appear; for a cluster you started with docker compose pass --file "
                              f"{os.path.join(run_dir, files[0])}, for `launcher up` the folder you give it")
    if file and kind != "freeze" and os.path.isfile(file):
        try:
            listed = compose(project or sanitize_project("chaos-check"), file, "config", "--services",
                             capture_output=True, text=True)
        except (LauncherError, OSError):  # no compose installed: the run's own start says so
            return
        services = listed.stdout.split() if listed.returncode == 0 else []
        nodes = sorted(s for s in services if s.startswith("node-"))  # compose keeps no order; names are padded
        if nodes and node not in services:
            raise ConfigError(f"{kind}: --{kind} {node}: {file} has no such service; its nodes: {', '.join(nodes)}; "
                              f"e.g. --{kind} {nodes[-1]}")
