"""The I/O side of ``python -m launcher up | status | logs | down`` (log following: launcher/observe/follow.py).

    python -m launcher up --mesh 2x2x2 --model tiny --steps 30
    python -m launcher up --mesh 4x1x2 --module launcher.container.probe --mount-code   # wiring test

``status``: the nodes' table, and how the run ended once it has (every container exited:
their exit codes; none left: when and how, from RUN_DIR/cluster.log).
``up``: refuses a run folder whose cluster is still up, writes RUN_DIR/compose.yml, builds the
image if missing (run/image.py), creates RUN_DIR (launcher/job/files.py make_run_dir), ``compose
up -d``, streams every container's log prefixed ``node-K rR |`` with a progress line from rank
0's step lines, waits for every container, prints a summary, ``compose down``. Exit 0 only if
every node exited 0. All lines shown also go to RUN_DIR/cluster.log.

Faults: the rendezvous names a lost node (``rendezvous: LOST node-1 (ranks 2-3): ...``, see
launcher/container/rendezvous.py) and the surviving nodes stop; once the rendezvous has exited,
``up`` kills whatever container of the run is still up (a frozen one is unpaused first), so
nothing is left running, and the summary names the lost node.
``max_restarts``: after a failed attempt, take the whole cluster down and start it again
(every node, a fresh rendezvous) with the trainer's ``--resume auto`` (the newest complete
checkpoint in RUN_DIR/checkpoints, from scratch if there is none yet), up to N times.
``start_late``: start a node's container S seconds after the others (drills).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from datetime import datetime

from simcluster.launcher.engines import docker as engine
from simcluster.launcher.drills import shaping
from simcluster.launcher.engines.compose_cli import compose
from simcluster.launcher.engines.docker import LauncherError
from simcluster.launcher.job.files import host_abspath, make_run_dir, project_dir_for, repo_path, write_atomic
from simcluster.launcher.engines.handle import Handle
from simcluster.launcher.job.launch import Launch, with_resume
from simcluster.launcher.container.layout import IMAGE, LABEL, RDZV_HOST
from simcluster.train.rundir import last_step, last_summary
from simcluster.launcher.engines.skeleton import Runner, UpOptions, follow_and_summarise, kill_all, open_stream
from simcluster.launcher.engines.image import check_image, ensure_image
from simcluster.launcher.engines.compose.render import render
from simcluster.train.errors import ConfigError


class ComposeRunner(Runner):
    """The Compose simulation: one container per node and a rendezvous container."""

    name = "compose"

    def check(self, launch: Launch, opts: UpOptions) -> None:
        """--max-restarts >= 0 and --start-late names nodes of this launch (shaping: drills/shaping.py check).

        Raises:
            ConfigError: naming the option and the fix.
        """
        if opts.max_restarts < 0:
            raise ConfigError(f"--max-restarts: must be >= 0, got {opts.max_restarts}")
        unknown = sorted(set(opts.start_late) - set(launch.names))
        if unknown:
            raise ConfigError(f"--start-late: no node {', '.join(unknown)} in {launch.shape}; nodes are "
                              f"{', '.join(launch.names)}")

    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """Run one job on a fresh cluster (see the module docstring), restarting it up to
        opts.max_restarts times after a failure (resuming from the run's newest checkpoint); returns
        the exit code of the last attempt. command: the regenerate line for the compose file's header.

        Raises:
            ConfigError: the run folder's cluster is still up (nothing is touched).
            LauncherError: Docker or Compose failed.
        """
        t0 = time.monotonic()
        run_dir = host_abspath(launch.run_dir)
        target = Handle.for_run(run_dir)
        running = {s: c.status for s, c in engine.containers(target.project).items() if c.status != "exited"}
        if running:
            raise ConfigError(f"run_dir: the cluster of {launch.run_dir} (project {target.project}) is still up "
                              f"({', '.join(f'{s} {st}' for s, st in sorted(running.items()))}); stop it with "
                              f"`python -m launcher down --run-dir {launch.run_dir}` or pass another --run-dir")
        if launch.node.image == IMAGE:
            ensure_image(IMAGE, opts.build, launch.node.mount_code)
        check_image(launch)
        make_run_dir(run_dir, launch.node.user)
        print(f"launcher: {launch.shape} = {launch.nnodes} node(s) x {launch.nproc_per_node} rank(s); "
              f"run folder {launch.run_dir}; project {target.project}", flush=True)
        if threading.current_thread() is threading.main_thread():  # the API may run `up` in another thread
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also stops the cluster
        attempt_launch, code = launch, 1
        for attempt in range(opts.max_restarts + 1):
            if attempt:
                attempt_launch = restart_launch(launch, attempt)
                where = ("your code resumes from what it saved in its output folder" if launch.train is None else
                         "the trainer resumes with --resume auto (the newest complete checkpoint, or from the start)")
                print(f"launcher: restart {attempt}/{opts.max_restarts} after {time.monotonic() - t0:.1f}s: whole "
                      f"cluster, fresh rendezvous; {where}", flush=True)
            write_atomic(target.file, render(attempt_launch, command, repo_path(target.file),
                                             project_dir_for(target.file)))
            code, codes = _attempt(attempt_launch, target, run_dir, opts, t0)
            timed_out = opts.wall_timeout_s is not None and time.monotonic() - t0 >= opts.wall_timeout_s
            final = code in (0, 130) or attempt == opts.max_restarts or any(c == 2 for c in codes.values()) or timed_out
            if code != 130 and not (final and opts.keep):  # exit 2: a configuration error, a restart would fail alike
                _force_down(target, capture_output=True)
            if final:
                return code
        return code


def restart_launch(launch: Launch, restart: int) -> Launch:
    """The launch of restart number ``restart`` (SIMCLUSTER_RESTART_COUNT): the built-in trainer
    resumes with ``--resume auto`` (the newest complete checkpoint of its run folder, or from the
    start: the same mechanism a torchrun restart uses); other code is told the count and resumes
    from its own files."""
    launch = dataclasses.replace(launch, restart=restart)
    return with_resume(launch, "auto") if launch.train is not None else launch


def _attempt(launch: Launch, target: Handle, run_dir: str, opts: UpOptions, t0: float) -> tuple[int, dict]:
    """One start of the cluster, to the summary; returns (exit code, service -> exit code)."""
    stream = open_stream(launch, run_dir, opts)
    start_late = opts.start_late
    try:
        first = [s for s in [RDZV_HOST, *launch.names] if s not in start_late]
        since = time.time()
        shaping.clear(run_dir)
        compose(target.project, target.file, "up", "-d", *(first if start_late else []), check=True,
                capture_output=opts.quiet)  # --quiet: compose's own lines only in an error
        if launch.node.inter_node_bandwidth:  # the nodes wait for their marker before starting ranks
            shaping.apply(launch, engine.containers(target.project), run_dir, stream.show)
        return follow_and_summarise(stream, launch, target, engine.containers(target.project), run_dir, since, t0,
                                    start_late, opts.deadline(t0))
    except KeyboardInterrupt:
        print("\nlauncher: interrupted; stopping the cluster", file=sys.stderr, flush=True)
        kill_all(target)
        _force_down(target, capture_output=True)
        return 130, {}
    except LauncherError:
        _force_down(target)
        raise


def _force_down(target: Handle, **kwargs) -> None:
    """``compose down``, unpausing frozen containers first (compose cannot stop a paused one)."""
    for c in engine.containers(target.project).values():
        if c.status == "paused":
            engine.unpause(c)
    compose(target.project, target.file, "down", "--remove-orphans", "-t", "5", **kwargs)


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


def ended_text(target: Handle, found: dict) -> str | None:
    """How the run ended, or None while any of its containers is not exited: every container
    exited (their exit codes, when the last one ended), or none is left (when RUN_DIR/cluster.log
    was last written and its summary line)."""
    log = f"{repo_path(target.run_dir)}/cluster.log" if target.run_dir else "RUN_DIR/cluster.log"
    if not found:
        ended = last_summary(target.run_dir)
        if ended is None:
            return (f"not running: no container of project {target.project} exists and there is no {log}; start the "
                    f"run with `python -m launcher up --run-dir {repo_path(target.run_dir) if target.run_dir else 'DIR'}"
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


def status(target: Handle) -> int:
    """Print a table node / ranks / state / last step from the containers' labels (an exited
    container's state with its exit code), then how the run ended when it has (ended_text); exit 0."""
    found = engine.containers(target.project)
    target = target.with_labels(found)
    step = last_step(target.run_dir)
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
    print(f"project {target.project}  file {os.path.relpath(target.file)}  run folder {target.run_dir or '?'}")
    if found:
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    ended = ended_text(target, found)
    if ended:
        print(ended)
    return 0


def logs(target: Handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
    """``compose logs`` of the target; returns its exit code."""
    return compose(target.project, target.file, "logs", "--no-color", "--tail", str(tail),
                   *(["--follow"] if follow else []), *services).returncode


def down(target: Handle) -> int:
    """``compose down`` of the target (containers + network); returns its exit code."""
    return compose(target.project, target.file, "down", "--remove-orphans").returncode
