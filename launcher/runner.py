"""The I/O side of ``python -m launcher up | status | logs | down``.

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
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

from launcher.compose import RDZV_HOST, RUNS_MOUNT, node_names, node_ranks, format_ranks, run_name
from launcher.dockercli import (ROOT, LauncherError, Target, compose, containers, exit_codes, image_exists,
                                nodes_from_doc)
from launcher.progress import Progress, parse_done, parse_identity, parse_step, split_rank
from train.checkpoint_paths import list_checkpoints
from train.config import Config, MeshSpec

KILL_AFTER_RDZV_S = 3.0  # containers still up this long after the rendezvous exited are killed
KILL_AFTER_NODES_S = 10.0  # a rendezvous still up this long after every node exited is killed


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


def _pump(service: str, cid: str, out: queue.Queue) -> None:
    proc = subprocess.Popen(["docker", "logs", "-f", cid], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", bufsize=1)
    for line in proc.stdout:
        out.put((service, line.rstrip("\n")))
    proc.wait()
    out.put((service, None))


class Stream:
    """Follows every container's log until all containers stopped; tracks progress and ranks."""

    def __init__(self, mesh: MeshSpec, log_path: str, quiet: bool, progress_every: float):
        self.mesh, self.quiet, self.every = mesh, quiet, progress_every
        self.names = node_names(mesh.pp)
        self.width = max(len(n) for n in self.names + [RDZV_HOST]) + 4
        self.progress = Progress()
        self.seen_ranks: dict[int, str] = {}
        self.misplaced: list[str] = []
        self.first_worker_s: float | None = None
        self.log = open(log_path, "a", encoding="utf-8")
        self.t0 = time.monotonic()
        self.last_progress = 0.0
        self.lost: list[str] = []  # "node-1 (ranks 2-3): reason", from the rendezvous' LOST lines
        self.lost_s: float | None = None  # seconds after start of the first LOST line
        self.lost_t: float | None = None  # its UNIX time
        self.forced: list[str] = []  # containers up kills because they outlived the rendezvous

    def show(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def handle(self, service: str, line: str) -> None:
        rank, text = split_rank(line)
        if service == RDZV_HOST and text.startswith("rendezvous: LOST "):
            self.lost.append(text[len("rendezvous: LOST "):])
            if self.lost_s is None:
                self.lost_s, self.lost_t = time.monotonic() - self.t0, time.time()
        if rank is not None and self.first_worker_s is None:
            self.first_worker_s = time.monotonic() - self.t0
        ident = parse_identity(text)
        if ident and rank is not None:
            r, host = ident
            self.seen_ranks[r] = service
            k = r // self.mesh.ranks_per_node
            if k >= len(self.names) or self.names[k] != service:
                self.misplaced.append(f"rank {r} ran on {service} (host={host}), expected on node {k}")
        step = parse_step(text) if rank == 0 else None
        done = parse_done(text) if rank == 0 else None
        if done:
            self.progress.done = done
        prefix = f"{service} r{rank}" if rank is not None else service
        if not (step and self.quiet):
            self.show(f"{prefix:<{self.width}}| {text}")
        if step:
            self.progress.update(step)
            now = time.monotonic()
            if now - self.last_progress >= self.every or step["step"] == step["total"]:
                self.last_progress = now
                self.show(f"{'launcher':<{self.width}}| {self.progress.line()}")

    def follow(self, ids: dict[str, str], watch: "Watch | None" = None) -> None:
        """Show every container's log until all ended; ``watch.tick()`` runs about every second
        and may start more containers (returned as service -> id) to follow too."""
        q: queue.Queue = queue.Queue()

        def start(more: dict[str, str]) -> int:
            for service, cid in more.items():
                threading.Thread(target=_pump, args=(service, cid, q), daemon=True).start()
            return len(more)

        open_streams = start(ids)
        last_tick = time.monotonic()
        while open_streams or (watch and watch.pending):
            try:
                service, line = q.get(timeout=1.0)
                if line is None:
                    open_streams -= 1
                else:
                    self.handle(service, line)
            except queue.Empty:
                pass
            if watch and time.monotonic() - last_tick >= 1.0:
                last_tick = time.monotonic()
                open_streams += start(watch.tick(self))


class Watch:
    """Runs during ``up``: starts late nodes when due, kills the container of a node the
    rendezvous declared lost (it is frozen or cut off, if not dead already), and once the
    rendezvous has exited kills every container of the run still up after KILL_AFTER_RDZV_S.
    A frozen (paused) container is unpaused first: a paused one cannot be stopped."""

    def __init__(self, target: Target, late: dict[str, float]):
        self.target, self.t0 = target, time.monotonic()
        self.late = dict(late)  # service -> seconds after start
        self.rdzv_gone: float | None = None
        self.nodes_gone: float | None = None
        self.last_poll = 0.0

    @property
    def pending(self) -> int:
        return len(self.late)

    def tick(self, stream: Stream) -> dict[str, str]:
        now = time.monotonic()
        started: dict[str, str] = {}
        named = {x.split()[0] for x in stream.lost}
        for service, delay in sorted(self.late.items()):
            if self.rdzv_gone is not None or service in named:
                stream.show(f"{'launcher':<{stream.width}}| not starting {service}: the job has already failed")
                del self.late[service]
            elif now - self.t0 >= delay:
                stream.show(f"{'launcher':<{stream.width}}| starting {service} {now - self.t0:.0f}s late (--start-late)")
                compose(self.target.project, self.target.file, "up", "-d", "--no-deps", service, capture_output=True)
                del self.late[service]
                cid = containers(self.target.project).get(service, {}).get("id")
                if cid:
                    started[service] = cid
        lost = {x.split()[0] for x in stream.lost} - set(stream.forced)
        if now - self.last_poll < 2.0 and self.rdzv_gone is None and not lost:
            return started
        self.last_poll = now
        try:
            state = containers(self.target.project)
        except LauncherError:
            return started
        rdzv = state.get(RDZV_HOST)
        if rdzv and rdzv["state"] not in ("running", "paused", "created", "restarting"):
            self.rdzv_gone = self.rdzv_gone or now
        nodes = [c for svc, c in state.items() if svc != RDZV_HOST]
        if nodes and not self.late and all(c["state"] in ("exited", "dead") for c in nodes):
            self.nodes_gone = self.nodes_gone or now  # the rendezvous itself may be the one frozen
        late_kill = (self.rdzv_gone is not None and now - self.rdzv_gone >= KILL_AFTER_RDZV_S) or \
            (self.nodes_gone is not None and now - self.nodes_gone >= KILL_AFTER_NODES_S)
        for service, c in sorted(state.items()):
            if c["state"] in ("running", "paused", "restarting") and (late_kill or service in lost):
                why = ("the rendezvous declared it lost" if service in lost else "the rendezvous ended"
                       if self.rdzv_gone is not None else "every node has exited")
                stream.show(f"{'launcher':<{stream.width}}| {service} is {c['state']} but {why}; killing it")
                stream.forced.append(service)
                if c["state"] == "paused":
                    subprocess.run(["docker", "unpause", c["id"]], capture_output=True)
                subprocess.run(["docker", "kill", c["id"]], capture_output=True)
        return started


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
