"""The I/O side of ``python -m launcher up | status | logs | down`` (log following: launcher/follow.py).

    python -m launcher up --mesh 2x2x2 --model tiny --steps 30
    python -m launcher up --mesh 4x1x2 --module launcher.probe --mount-code   # wiring test

``up``: writes RUN_DIR/compose.yml, builds the image if missing (images/build.sh), creates
RUN_DIR mode 0777 (the containers run as uid 1000), ``compose up -d``, streams every
container's log prefixed ``node-K rR |`` with a progress line from rank 0's step lines,
waits for every container, prints a summary, ``compose down``. Exit 0 only if every node
exited 0. All lines shown also go to RUN_DIR/cluster.log.

Faults: the rendezvous names a lost node (``rendezvous: LOST node-1 (ranks 2-3): ...``, see
launcher/rendezvous.py) and the surviving nodes stop; once the rendezvous has exited, ``up``
kills whatever container of the run is still up (a frozen one is unpaused first, a cut-off
one killed) so nothing is left running, and the summary names the lost node.
``--max-restarts N``: after a failed attempt, take the whole cluster down and start it again
(every node, a fresh rendezvous), resuming from the newest checkpoint in RUN_DIR/checkpoints
(``--resume /runs/<run>/checkpoints``; from scratch if there is none yet), up to N times.
``--start-late NODE=S``: start that node's container S seconds after the others (drills).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

from launcher.compose import RDZV_HOST, RUNS_MOUNT, node_names, node_ranks, format_ranks, run_name
from launcher.dockercli import (ROOT, LauncherError, Target, compose, containers, exit_codes, image_exists,
                                nodes_from_doc)
from launcher.follow import Stream, Watch
from train.checkpoint_paths import list_checkpoints
from train.config import Config, MeshSpec

def default_run_dir_up(mesh: MeshSpec) -> str:
    """``runs/PPxDPxTP-<UTC timestamp>`` (e.g. runs/2x2x2-20250101T120000Z)."""
    return f"runs/{mesh}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"


def ensure_image(image: str, build: bool, mount_code: bool = False) -> None:
    """Build the trainer image with images/build.sh if it is missing (or build is set); warn
    when this checkout's code is newer than the image (unless mount_code).

    Raises:
        LauncherError: the build failed, or a non-default image is missing.
    """
    if image_exists(image) and not build:
        stale = None if mount_code else newer_than_image(image)
        if stale:
            print(f"launcher: WARNING: {stale} changed after {image} was built; the containers run the image's "
                  f"copy. Use --build (rebuild) or --mount-code (mount this checkout).", file=sys.stderr, flush=True)
        return
    if image != "simcluster/trainer:latest":
        raise LauncherError(f"image {image} not found; build or pull it (images/build.sh builds simcluster/trainer:latest)")
    print(f"launcher: building {image} with images/build.sh", flush=True)
    if subprocess.run(["bash", os.path.join(ROOT, "images", "build.sh")], cwd=ROOT).returncode != 0:
        raise LauncherError("images/build.sh failed; see its output above")


def newer_than_image(image: str) -> str | None:
    """A train/ or launcher/ file modified after the image was created, else None."""
    proc = subprocess.run(["docker", "image", "inspect", "-f", "{{.Created}}", image], capture_output=True, text=True)
    try:
        created = datetime.fromisoformat(proc.stdout.strip()[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return None
    for folder in ("train", "launcher"):
        for base, _dirs, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                path = os.path.join(base, name)
                if name.endswith(".py") and os.path.getmtime(path) > created + 1:
                    return os.path.relpath(path, ROOT)
    return None


def _final_metrics(run_dir: str, done: dict) -> dict:
    """final_loss / tokens_per_s / wall_s from the done line, else metrics.jsonl's last row."""
    out = {k: done.get(k) for k in ("final_loss", "tokens_per_s", "wall_s", "steps")}
    path = os.path.join(run_dir, "metrics.jsonl")
    if out["final_loss"] is None and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(x) for x in fh if x.strip()]
        if rows:
            out.update(final_loss=rows[-1].get("loss"), tokens_per_s=rows[-1].get("tokens_per_s"),
                       steps=rows[-1].get("step"))
    return out


def up(cfg: Config, node, compose_text, build: bool = False, keep: bool = False, quiet: bool = False,
       progress_every: float = 10.0, max_restarts: int = 0, start_late: dict[str, float] | None = None) -> int:
    """Run one job on a fresh cluster (see the module docstring), restarting it up to
    max_restarts times after a failure (resuming from the run's newest checkpoint); returns
    the exit code of the last attempt."""
    from launcher.cli import write_atomic

    t0 = time.monotonic()
    mesh = cfg.mesh_spec()
    run_dir = cfg.run_dir if os.path.isabs(cfg.run_dir) else os.path.join(ROOT, cfg.run_dir)
    os.makedirs(run_dir, exist_ok=True)
    os.chmod(run_dir, 0o777)  # the containers run as uid 1000
    target = Target.for_run(run_dir)
    unknown = sorted(set(start_late or {}) - set(node_names(mesh.pp)))
    if unknown:
        from train.config import ConfigError

        raise ConfigError(f"--start-late: no node {', '.join(unknown)} in mesh {mesh}; nodes are {', '.join(node_names(mesh.pp))}")
    write_atomic(target.file, compose_text(cfg, node, target.file))
    ensure_image(node.image, build, node.mount_code)
    print(f"launcher: mesh {mesh} = {mesh.pp} node(s) x {mesh.ranks_per_node} rank(s); run folder {cfg.run_dir}; "
          f"project {target.project}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also stops the cluster
    attempt_cfg = cfg
    for attempt in range(max_restarts + 1):
        if attempt:
            attempt_cfg = restart_config(cfg, run_dir)
            where = f"resuming from {attempt_cfg.resume}" if attempt_cfg.resume != cfg.resume else "no checkpoint yet: starting over"
            print(f"launcher: restart {attempt}/{max_restarts} after {time.monotonic() - t0:.1f}s: whole cluster, "
                  f"fresh rendezvous; {where}", flush=True)
            write_atomic(target.file, compose_text(attempt_cfg, node, target.file))
        code, codes = _attempt(attempt_cfg, target, run_dir, quiet, progress_every, start_late or {}, t0)
        final = code in (0, 130) or attempt == max_restarts or any(c == 2 for c in codes.values())
        if code != 130 and not (final and keep):  # exit 2: a configuration error, a restart would fail alike
            _force_down(target, capture_output=True)
        if final:
            return code
    return code


def restart_config(cfg: Config, run_dir: str) -> Config:
    """The config of a restart: resume from RUN_DIR/checkpoints (as the containers see it) when
    a complete checkpoint is there, else cfg unchanged (start over)."""
    import dataclasses

    if not list_checkpoints(os.path.join(run_dir, "checkpoints")):
        return cfg
    return dataclasses.replace(cfg, resume=f"{RUNS_MOUNT}/{run_name(cfg.run_dir)}/checkpoints")


def _attempt(cfg: Config, target: Target, run_dir: str, quiet: bool, progress_every: float,
             start_late: dict[str, float], t0: float) -> tuple[int, dict]:
    """One start of the cluster, to the summary; returns (exit code, service -> exit code)."""
    mesh = cfg.mesh_spec()
    stream = Stream(mesh, os.path.join(run_dir, "cluster.log"), quiet, progress_every)
    watch = Watch(target, start_late)
    try:
        first = [s for s in [RDZV_HOST, *node_names(mesh.pp)] if s not in start_late]
        compose(target.project, target.file, "up", "-d", *(first if start_late else []), check=True)
        ids = {s: c["id"] for s, c in containers(target.project).items()}
        stream.follow(ids, watch)
        ids = {s: c["id"] for s, c in containers(target.project).items()}
        codes = exit_codes(ids)
    except KeyboardInterrupt:
        print("\nlauncher: interrupted; stopping the cluster", file=sys.stderr, flush=True)
        _force_down(target)
        return 130, {}
    except LauncherError:
        _force_down(target)
        raise
    wall = time.monotonic() - t0
    ok = _summary(stream, cfg, run_dir, codes, wall)
    return (0 if ok else 1), codes


def _force_down(target: Target, **kwargs) -> None:
    """``compose down``, unpausing frozen containers first (compose cannot stop a paused one)."""
    try:
        for c in containers(target.project).values():
            if c["state"] == "paused":
                subprocess.run(["docker", "unpause", c["id"]], capture_output=True)
    except LauncherError:
        pass
    compose(target.project, target.file, "down", "--remove-orphans", "-t", "5", **kwargs)


def _summary(stream: Stream, cfg: Config, run_dir: str, codes: dict, wall: float) -> bool:
    mesh = cfg.mesh_spec()
    names = node_names(mesh.pp)
    ok = all(codes.get(n) == 0 for n in names) and not stream.lost
    m = _final_metrics(run_dir, stream.progress.done)
    show = stream.show
    show(f"== summary: {'OK' if ok else 'FAILED'} ==")
    show(f"  run folder   {cfg.run_dir}")
    show(f"  wall time    {wall:.1f}s (launcher, up to last exit)" + (f"; trainer wall_s {m['wall_s']}" if m["wall_s"] else ""))
    if stream.first_worker_s is not None:
        show(f"  first rank output after {stream.first_worker_s:.1f}s")
    show(f"  final loss   {m['final_loss'] if m['final_loss'] is not None else '?'}"
         + (f" after {m['steps']} steps" if m["steps"] is not None else ""))
    show(f"  tokens/s     {m['tokens_per_s'] if m['tokens_per_s'] is not None else '?'}")
    seen = len(stream.seen_ranks)
    show(f"  ranks seen   {seen}/{mesh.world_size}" + ("" if not stream.misplaced else "; MISPLACED: " + "; ".join(stream.misplaced)))
    for k, name in enumerate(names):
        show(f"  {name:<11}  ranks {format_ranks(node_ranks(mesh, k)):<8} exit {codes.get(name)}")
    show(f"  {RDZV_HOST:<11}  {'':<14} exit {codes.get(RDZV_HOST)}")
    for lost in stream.lost:
        show(f"  LOST         {lost}" + (f" (named {stream.lost_s:.1f}s after start, t={stream.lost_t:.3f})"
                                             if stream.lost_s else ""))
    if stream.forced:
        show(f"  killed by up {', '.join(stream.forced)} (lost, or still up after the rendezvous ended)")
    stream.log.close()
    return ok


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
    """Print a table node / ranks / state / last step; exit 0."""
    state = containers(target.project)
    step = last_step(target.run_dir)
    rows = [("NODE", "RANKS", "STATE", "LAST STEP")]
    for name, ranks in nodes_from_doc(target.doc()):
        c = state.get(name)
        rows.append((name, ranks, c["status"] if c else "not created", step))
    c = state.get(RDZV_HOST)
    rows.append((RDZV_HOST, "-", c["status"] if c else "not created", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"project {target.project}  file {os.path.relpath(target.file)}  run folder {target.run_dir}")
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
