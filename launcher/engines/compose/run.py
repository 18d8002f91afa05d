"""``launcher up`` on Compose: the simulation started, followed, restarted, summarised, taken down.

    python -m launcher up --mesh 2x2x2 --model tiny --steps 30
    python -m launcher up --mesh 4x1x2 --module launcher.container.probe --mount-code   # wiring test

Log following: launcher/observe/follow.py; status, logs, down: status.py.
``up``: refuses a run folder whose cluster is still up, writes RUN_DIR/compose.yml, builds the
image if missing (engines/image.py), creates RUN_DIR (launcher/job/files.py make_run_dir), ``compose
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

import signal
import sys
import threading
import time

from simcluster.launcher.drills import shaping
from simcluster.launcher.docker.compose_cli import compose
from simcluster.launcher.docker.client import Client, LauncherError
from simcluster.launcher.docker.container import unpause
from simcluster.launcher.job.files import host_abspath, make_run_dir, project_dir_for, repo_path, write_atomic
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.job.launch import Launch, restart_launch
from simcluster.launcher.container.layout import IMAGE, RDZV_HOST
from simcluster.launcher.engines.base import UpOptions
from simcluster.launcher.engines.skeleton import follow_and_summarise, kill_all, open_stream
from simcluster.launcher.engines.deps_image import with_image
from simcluster.launcher.engines.image import check_image, ensure_image
from simcluster.launcher.engines.compose.render import render
from simcluster.core.errors import ConfigError


def up_problems(launch: Launch, opts: UpOptions) -> list[str]:
    """--max-restarts >= 0, --start-late names nodes of this launch (shaping: drills/shaping.py check), --build
    only with the trainer's image (the one it builds); each problem names the option and the fix."""
    problems = [f"--max-restarts: must be >= 0, got {opts.max_restarts}"] if opts.max_restarts < 0 else []
    if opts.build and launch.node.image != IMAGE:  # ensure_image builds IMAGE only: --build did nothing unsaid
        problems.append(f"--build: builds the trainer image {IMAGE}, and --image {launch.node.image} runs another, "
                        f"which is yours to build; drop --build, or --image to run a fresh {IMAGE}")
    unknown = sorted(set(dict(opts.start_late)) - set(launch.names))
    if unknown:
        problems.append(f"--start-late: no node {', '.join(unknown)} in {launch.shape}; nodes are "
                        f"{', '.join(launch.names)}")
    return problems


def up(launch: Launch, command: str, opts: UpOptions) -> int:
    """Run one job on a fresh cluster (see the module docstring), restarting it up to
    opts.max_restarts times after a failure (resuming from the run's newest checkpoint); returns
    the exit code of the last attempt. command: the regenerate line for the compose file's header.

    Raises:
        ConfigError: the run folder's cluster is still up (nothing is touched).
        LauncherError: Docker or Compose failed.
    """
    t0 = time.monotonic()
    run_dir = host_abspath(launch.run_dir)
    handle, client = Handle.for_run(run_dir), Client()  # the simulation: containers of this machine's daemon
    running = {s: c.status for s, c in client.containers(handle.project).items() if c.status != "exited"}
    if running:
        raise ConfigError(f"run_dir: the cluster of {launch.run_dir} (project {handle.project}) is still up "
                          f"({', '.join(f'{s} {st}' for s, st in sorted(running.items()))}); stop it with "
                          f"`python -m launcher down --run-dir {launch.run_dir}` or pass another --run-dir")
    if launch.node.image == IMAGE:
        ensure_image(IMAGE, opts.build, launch.node.mount_code)
    launch = with_image(launch)  # --requirements: the derived image, FROM the one just ensured
    check_image(launch)
    make_run_dir(run_dir, launch.node.user, launch.record())
    print(f"launcher: {launch.layout}; "
          f"run folder {launch.run_dir}; project {handle.project}", flush=True)
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
        write_atomic(handle.file, render(attempt_launch, command, repo_path(handle.file),
                                         project_dir_for(handle.file)))
        code, codes = _attempt(client, attempt_launch, handle, run_dir, opts, t0)
        timed_out = opts.wall_timeout_s is not None and time.monotonic() - t0 >= opts.wall_timeout_s
        final = code in (0, 130) or attempt == opts.max_restarts or any(c == 2 for c in codes.values()) or timed_out
        if code != 130 and not (final and opts.keep):  # exit 2: a configuration error, a restart would fail alike
            _force_down(client, handle, capture_output=True)
        if final:
            return code
    return code


def _attempt(client: Client, launch: Launch, handle: Handle, run_dir: str, opts: UpOptions,
             t0: float) -> tuple[int, dict]:
    """One start of the cluster, to the summary; returns (exit code, service -> exit code)."""
    stream = open_stream(launch, run_dir, opts)
    start_late = dict(opts.start_late)
    try:
        first = [s for s in [RDZV_HOST, *launch.names] if s not in start_late]
        since = time.time()
        shaping.clear(run_dir)
        compose(handle.project, handle.file, "up", "-d", *(first if start_late else []), check=True,
                capture_output=opts.quiet)  # --quiet: compose's own lines only in an error
        if launch.node.inter_node_bandwidth:  # the nodes wait for their marker before starting ranks
            shaping.apply(client, launch, client.containers(handle.project), run_dir, stream.show)
        return follow_and_summarise(client, stream, launch, handle, client.containers(handle.project), run_dir, since,
                                    t0, opts)
    except KeyboardInterrupt:
        print("\nlauncher: interrupted; stopping the cluster", file=sys.stderr, flush=True)
        kill_all(client, handle)
        _force_down(client, handle, capture_output=True)
        return 130, {}
    except LauncherError:
        _force_down(client, handle)
        raise
    except BaseException:  # anything else (stdout closed under `| head`: BrokenPipeError): no cluster left behind
        kill_all(client, handle)
        _force_down(client, handle, capture_output=True)
        raise


def _force_down(client: Client, handle: Handle, **kwargs) -> None:
    """``compose down``, unpausing frozen containers first (compose cannot stop a paused one)."""
    for c in client.containers(handle.project).values():
        if c.status == "paused":
            unpause(c)
    compose(handle.project, handle.file, "down", "--remove-orphans", "-t", "5", **kwargs)
