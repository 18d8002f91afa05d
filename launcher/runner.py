"""The I/O side of ``python -m launcher up | status | logs | down`` (log following: follow.py).

    python -m launcher up --mesh 2x2x2 --model tiny --steps 30
    python -m launcher up --mesh 4x1x2 --module launcher.container.probe --mount-code   # wiring test

``up``: refuses a run folder whose cluster is still up, writes RUN_DIR/compose.yml, builds the
image if missing (images/build.sh), creates RUN_DIR (launcher/files.py make_run_dir), ``compose
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
import json
import os
import signal
import subprocess
import sys
import time

from launcher import engine, shaping
from launcher.compose import LABEL, render
from launcher.engine import LauncherError, compose
from launcher.files import ROOT, code_digest, host_abspath, make_run_dir, project_dir_for, repo_path, write_atomic
from launcher.follow import Stream, Watch
from launcher.summary import summarise
from launcher.launch import Launch, with_resume
from launcher.layout import APP_DIR, IMAGE, RDZV_HOST
from launcher.target import Target
from train.config import ConfigError


def ensure_image(image: str, build: bool, mount_code: bool = False) -> None:
    """Build the trainer image with images/build.sh if it is missing (or build is set); warn
    when the image's code (its io.simcluster.code-digest label) differs from this checkout's (unless mount_code).

    Raises:
        LauncherError: the build failed.
    """
    labels = engine.image_labels(image)
    if labels is not None and not build:
        if not mount_code and labels.get(LABEL + "code-digest") != code_digest():
            print(f"launcher: WARNING: this checkout's train/ or launcher/ code differs from the copy in {image}; "
                  f"the containers run the image's copy. Use --build (rebuild) or --mount-code (mount this "
                  f"checkout).", file=sys.stderr, flush=True)
        return
    print(f"launcher: building {image} with images/build.sh", flush=True)
    if subprocess.run(["bash", os.path.join(ROOT, "images", "build.sh")], cwd=ROOT).returncode != 0:
        raise LauncherError("images/build.sh failed; see its output above")


def check_image(launch: Launch) -> None:
    """A short probe container: the image has python, torch and the launcher's container side
    (and the module, when it comes from the image). Only for images other than the trainer's,
    or modules from the image.

    Raises:
        ConfigError: something is missing, naming the image and the fix.
    """
    from_image = [launch.module] if launch.train is None and launch.module and not launch.workdir else []
    if launch.node.image == IMAGE and not from_image:
        return
    volumes = [f"{host_abspath(p)}:{APP_DIR}/{p}:ro" for p in ("train", "launcher") if launch.node.mount_code]
    problem = engine.probe_image(launch.node.image, ["torch", "launcher.container.node", *from_image], volumes,
                                 launch.node.user)
    if problem:
        raise ConfigError(f"image: {launch.node.image}: {problem}. Every node runs `python -m launcher.container.node`"
                          f" and the job with torch: use an image FROM {IMAGE}, or install torch==2.13.0 and this "
                          f"project's wheel into yours (README, \"Your own image\")"
                          + (f"; or check --module {from_image[0]}" if from_image else ""))


def up(launch: Launch, command: str, build: bool = False, keep: bool = False, quiet: bool = False,
       progress_every: float = 10.0, max_restarts: int = 0, start_late: dict[str, float] | None = None) -> int:
    """Run one job on a fresh cluster (see the module docstring), restarting it up to
    max_restarts times after a failure (resuming from the run's newest checkpoint); returns
    the exit code of the last attempt. command: the regenerate line for the compose file's header.

    Raises:
        ConfigError: the run folder's cluster is still up (nothing is touched).
        LauncherError: Docker or Compose failed.
    """
    t0 = time.monotonic()
    run_dir = host_abspath(launch.run_dir)
    target = Target.for_run(run_dir)
    running = {s: c.status for s, c in engine.containers(target.project).items() if c.status != "exited"}
    if running:
        raise ConfigError(f"run_dir: the cluster of {launch.run_dir} (project {target.project}) is still up "
                          f"({', '.join(f'{s} {st}' for s, st in sorted(running.items()))}); stop it with "
                          f"`python -m launcher down --run-dir {launch.run_dir}` or pass another --run-dir")
    if launch.node.image == IMAGE:
        ensure_image(IMAGE, build, launch.node.mount_code)
    check_image(launch)
    make_run_dir(run_dir, launch.node.user)
    print(f"launcher: {launch.shape} = {launch.nnodes} node(s) x {launch.nproc_per_node} rank(s); "
          f"run folder {launch.run_dir}; project {target.project}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also stops the cluster
    attempt_launch, code = launch, 1
    for attempt in range(max_restarts + 1):
        if attempt:
            attempt_launch = restart_launch(launch, attempt)
            where = ("your code resumes from what it saved in its output folder" if launch.train is None else
                     "the trainer resumes with --resume auto (the newest complete checkpoint, or from the start)")
            print(f"launcher: restart {attempt}/{max_restarts} after {time.monotonic() - t0:.1f}s: whole cluster, "
                  f"fresh rendezvous; {where}", flush=True)
        write_atomic(target.file, render(attempt_launch, repo_path(target.file), project_dir_for(target.file), command))
        code, codes = _attempt(attempt_launch, target, run_dir, quiet, progress_every, start_late or {}, t0)
        final = code in (0, 130) or attempt == max_restarts or any(c == 2 for c in codes.values())
        if code != 130 and not (final and keep):  # exit 2: a configuration error, a restart would fail alike
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


def _attempt(launch: Launch, target: Target, run_dir: str, quiet: bool, progress_every: float,
             start_late: dict[str, float], t0: float) -> tuple[int, dict]:
    """One start of the cluster, to the summary; returns (exit code, service -> exit code)."""
    stream = Stream(launch, os.path.join(run_dir, "cluster.log"), quiet, progress_every)
    try:
        first = [s for s in [RDZV_HOST, *launch.names] if s not in start_late]
        since = time.time()
        shaping.clear(run_dir)
        compose(target.project, target.file, "up", "-d", *(first if start_late else []), check=True)
        if launch.node.inter_node_bandwidth:  # the nodes wait for their marker before starting ranks
            shaping.apply(launch, engine.containers(target.project), run_dir, stream.show)
        watch = Watch(target, start_late, os.path.join(run_dir, "metrics.jsonl"), since)
        try:
            stream.follow(engine.containers(target.project), watch)
        finally:
            watch.close()
        codes = {s: engine.exit_code(c) for s, c in engine.containers(target.project).items()}
    except KeyboardInterrupt:
        print("\nlauncher: interrupted; stopping the cluster", file=sys.stderr, flush=True)
        for c in engine.containers(target.project).values():  # at once: Ctrl-C ends everything within seconds
            engine.kill(c)
        _force_down(target, capture_output=True)
        return 130, {}
    except LauncherError:
        _force_down(target)
        raise
    ok = summarise(stream, launch, run_dir, codes, time.monotonic() - t0)
    return (0 if ok else 1), codes


def _force_down(target: Target, **kwargs) -> None:
    """``compose down``, unpausing frozen containers first (compose cannot stop a paused one)."""
    for c in engine.containers(target.project).values():
        if c.status == "paused":
            c.unpause()
    compose(target.project, target.file, "down", "--remove-orphans", "-t", "5", **kwargs)


def last_step(run_dir: str | None) -> str:
    """The step of the last metrics.jsonl row in run_dir, or "-"."""
    path = os.path.join(run_dir or "", "metrics.jsonl")
    if not run_dir or not os.path.isfile(path):
        return "-"
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 4096))
        lines = [x for x in fh.read().decode("utf-8", "replace").splitlines() if x.strip()]
    try:
        return str(json.loads(lines[-1]).get("step", "-")) if lines else "-"
    except ValueError:
        return "-"


def status(target: Target) -> int:
    """Print a table node / ranks / state / last step from the containers' labels; exit 0."""
    found = engine.containers(target.project)
    target = target.with_labels(found)
    step = last_step(target.run_dir)
    nodes = sorted((c for s, c in found.items() if LABEL + "node-rank" in c.labels),
                   key=lambda c: int(c.labels[LABEL + "node-rank"]))
    rows = [("NODE", "RANKS", "STATE", "LAST STEP")]
    rows += [(c.labels["com.docker.compose.service"], c.labels[LABEL + "ranks"], c.status, step) for c in nodes]
    rdzv = found.get(RDZV_HOST)
    rows.append((RDZV_HOST, "-", rdzv.status if rdzv else "not created", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"project {target.project}  file {os.path.relpath(target.file)}  run folder {target.run_dir or '?'}")
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0


def logs(target: Target, services: list[str], follow: bool = False, tail: str = "all") -> int:
    """``compose logs`` of the target; returns its exit code."""
    return compose(target.project, target.file, "logs", "--no-color", "--tail", str(tail),
                   *(["--follow"] if follow else []), *services).returncode


def down(target: Target) -> int:
    """``compose down`` of the target (containers + network); returns its exit code."""
    return compose(target.project, target.file, "down", "--remove-orphans").returncode
