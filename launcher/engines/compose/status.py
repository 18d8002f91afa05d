"""``launcher status``, ``logs`` and ``down`` of a Compose run: the nodes' table, how it ended, its logs.

    python -m launcher status [--run-dir DIR | --file FILE]

``status``: the nodes' table, and how the run ended once it has (every container exited:
their exit codes; none left: when and how, from RUN_DIR/cluster.log).
"""
from __future__ import annotations

import os
import signal
import time
from datetime import datetime

from simcluster.launcher.container.layout import LABEL, RDZV_HOST
from simcluster.launcher.docker.client import Client
from simcluster.launcher.docker.compose_cli import compose
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.job.files import repo_path
from simcluster.core.rundir import last_step
from simcluster.core.runlog import last_summary


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def exit_text(code: int | None) -> str:
    """``0``, ``1``, ``137 (SIGKILL)``: a container's exit code, naming the signal of one above 128."""
    if code is None:
        return "?"
    try:
        return f"{code} ({signal.Signals(code - 128).name})" if code > 128 else str(code)
    except ValueError:
        return str(code)


def _finished(container) -> float | None:
    text = container.attrs.get("State", {}).get("FinishedAt", "")
    try:
        t = datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return None
    return t if t > 0 else None  # an unstarted container's FinishedAt is year 1


def ended_text(handle: Handle, found: dict) -> str | None:
    """How the run ended, or None while any of its containers is not exited: every container
    exited (their exit codes, when the last one ended), or none is left (when RUN_DIR/cluster.log
    was last written and its summary line)."""
    log = f"{repo_path(handle.run_dir)}/cluster.log" if handle.run_dir else "RUN_DIR/cluster.log"
    if not found:
        ended = last_summary(handle.run_dir)
        if ended is None:
            return (f"not running: no container of project {handle.project} exists and there is no {log}; start the "
                    f"run with `python -m launcher up --run-dir {repo_path(handle.run_dir) if handle.run_dir else 'DIR'}"
                    f" ...`")
        t, summary = ended
        how = f" ({summary.strip('= ').replace('summary: ', 'summary ')})" if summary else ""
        return f"not running; the last run ended at {_when(t)}{how}, see {log} for its summary"
    if any(c.status not in ("exited", "dead") for c in found.values()):
        return None
    codes = ", ".join(f"{s} {exit_text(c.attrs.get('State', {}).get('ExitCode'))}" for s, c in sorted(found.items()))
    times = [t for t in map(_finished, found.values()) if t]
    at = f" at {_when(max(times))}" if times else ""
    return (f"not running: the run ended{at}, every container has exited (exit codes: {codes}); see {log} for its "
            f"summary, `python -m launcher down` removes them")


def status(client: Client, handle: Handle) -> int:
    """Print a table node / ranks / state / last step from the containers' labels (an exited
    container's state with its exit code), then how the run ended when it has (ended_text); exit 0."""
    found = client.containers(handle.project)
    handle = handle.with_labels(found)
    step = last_step(handle.run_dir)
    step = "-" if step is None else str(step)

    def state(c) -> str:
        code = c.attrs.get("State", {}).get("ExitCode") if c.status in ("exited", "dead") else None
        return c.status if code is None else f"{c.status} {exit_text(code)}"

    nodes = sorted((c for s, c in found.items() if LABEL + "node-rank" in c.labels),
                   key=lambda c: int(c.labels[LABEL + "node-rank"]))
    rows = [("NODE", "RANKS", "STATE", "LAST STEP")]
    rows += [(c.labels["com.docker.compose.service"], c.labels[LABEL + "ranks"], state(c), step) for c in nodes]
    rdzv = found.get(RDZV_HOST)
    rows.append((RDZV_HOST, "-", state(rdzv) if rdzv else "not created", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"project {handle.project}  file {os.path.relpath(handle.file)}  run folder {handle.run_dir or '?'}")
    if found:
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    ended = ended_text(handle, found)
    if ended:
        print(ended)
    return 0


def logs(handle: Handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
    """``compose logs`` of the handle; returns its exit code."""
    return compose(handle.project, handle.file, "logs", "--no-color", "--tail", str(tail),
                   *(["--follow"] if follow else []), *services).returncode


def down(handle: Handle) -> int:
    """``compose down`` of the handle (containers + network); returns its exit code."""
    return compose(handle.project, handle.file, "down", "--remove-orphans").returncode
