"""Fault injection against a running cluster: ``python -m launcher chaos``.

    python -m launcher chaos --kill node-1 --at-step 5            # newest run under runs/
    python -m launcher chaos --pause node-0 --at-step 20 --run-dir runs/2x2x2-20250101T120000Z
    python -m launcher chaos --disconnect node-1 --at-step 3 --file docker-compose.yml

Waits until the run reaches step N (the last row of RUN_DIR/metrics.jsonl written since the
node started, else the newest ``step N/M`` line in node-0's log), then applies one fault to the
node's container and prints what it did (with the UNIX time, to measure detection):
    --kill        ``docker kill``: the container and its ranks die at once
    --stop        ``docker stop``: SIGTERM to the node (reported as stopped by a signal, 143)
    --pause       ``docker pause``: the container freezes (its processes stop, sockets stay open)
    --disconnect  ``docker network disconnect``: the container loses the cluster network
    --freeze R    SIGSTOP rank R's process inside its node (the node's heartbeat goes on)
The run should then end within the trainer's --timeout-s (default 60 s) with an error naming
the node (see launcher/container/rendezvous.py). It prints at once what it waits for (run, step,
node, deadline). Start it with or after ``launcher up``: if no container of the run exists it
says so, waits up to START_WAIT_S (120 s) for ``up`` to create them, then gives up naming
``launcher up``. Exit 0 once the fault is applied; 1 if nothing ran, the run ended (or --wait-s
ran out) before step N, or Docker refused.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import datetime

from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.docker.container import disconnect, exec_in, kill, log_text, pause, stop
from simcluster.launcher.observe.progress import parse_step, split_rank
from simcluster.launcher.container.layout import LABEL, RDZV_HOST
from simcluster.core.layout import node_names, rank_range
from simcluster.core.rundir import METRICS, last_step
from simcluster.core.runlog import read_job
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.drills.chaos_checks import check_args, check_generated, check_step
from simcluster.core.errors import ConfigError

START_WAIT_S = 120.0  # how long chaos waits for a first container of the run (`launcher up` starting it)


def _print(text: str, error: bool = False) -> None:
    print(text, file=sys.stderr if error else sys.stdout, flush=True)


def _started_at(container) -> float:
    text = container.attrs["State"].get("StartedAt", "")
    try:
        return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return 0.0


def log_step(container) -> int | None:
    """The newest ``step N/M`` line of rank 0 in a container's log."""
    step = None
    for line in log_text(container, tail=300).splitlines():
        rank, text = split_rank(line)
        parsed = parse_step(text) if rank == 0 else None
        if parsed:
            step = max(step or 0, int(parsed["step"]))
    return step


def _find_handle(run_dir, file, project, deadline: float) -> Handle:
    while True:
        try:
            return Handle.find(run_dir, file, project)
        except ConfigError:
            if time.monotonic() > deadline or file:
                raise
            time.sleep(1.0)


def node_of_rank(found: dict, rank: int) -> str | None:
    """The service whose container holds global rank (its io.simcluster.ranks label, ``4-7``)."""
    for service, c in found.items():
        first, _, last = c.labels.get(LABEL + "ranks", "").partition("-")
        if first.isdigit() and int(first) <= rank <= int(last or first):
            return service
    return None


def apply_fault(kind: str, container, rank: int | None = None) -> str:
    """Apply the fault to a container through the engine (``freeze``: SIGSTOP rank's process
    in it); returns what was done.

    Raises:
        LauncherError: the engine refused (e.g. the container is on no network, no such rank).
    """
    if kind == "freeze":
        first = container.labels[LABEL + "ranks"].split("-")[0]
        rc, text = exec_in(container, ["python", "-m", "simcluster.launcher.container.ranks", "--rank",
                                       str(rank), "--first-rank", first, "--signal", "STOP"])
        if rc != 0:
            raise LauncherError(f"freeze of rank {rank} failed: {text.strip()}")
        return text.strip()
    if kind == "kill":
        kill(container, strict=True)
        return "kill"
    if kind == "stop":
        stop(container, 10)
        return "stop (SIGTERM, then SIGKILL after 10 s)"
    if kind == "pause":
        pause(container)  # retried: runc's freeze can fail transiently while a process forks
        return "pause"
    nets = disconnect(container)
    if not nets:
        raise LauncherError(f"container {container.short_id} is on no network")
    return "network disconnect " + ", ".join(nets)


def cluster_nodes(handle: Handle, found: dict) -> tuple[dict[str, str], int] | None:
    """({node: its ranks "4-7"}, world size) of the run: its record (RUN_DIR/job.json, written by
    `up`), else its rendezvous container's labels (nnodes, nproc-per-node) once found; None for a
    cluster that names neither (another compose file's)."""
    if (job := read_job(handle.run_dir)) is not None:
        return job["nodes"], job["world_size"]
    labels = found[RDZV_HOST].labels if RDZV_HOST in found else {}
    nnodes, nproc = labels.get(LABEL + "nnodes", ""), labels.get(LABEL + "nproc-per-node", "")
    if not (nnodes.isdigit() and nproc.isdigit()):
        return None
    nodes = {name: rank_range(k, int(nproc)) for k, name in enumerate(node_names(int(nnodes)))}
    return nodes, int(nnodes) * int(nproc)


def check_node(kind: str, node: str, handle: Handle, found: dict) -> bool:
    """Whether the cluster's nodes are known yet (cluster_nodes); when they are, the node (or, for
    freeze, the rank) must be one of them.

    Raises:
        ConfigError: it is not, listing the cluster's nodes (and their ranks).
    """
    known = cluster_nodes(handle, found)
    if known is None:
        return False
    nodes, world = known
    listing = ", ".join(f"{n} (ranks {r})" for n, r in nodes.items())
    if kind == "freeze":
        if not int(node) < world:
            raise ConfigError(f"freeze: --freeze {node}: the cluster of {handle.run_dir or handle.file} has ranks "
                              f"0-{world - 1} ({listing}); e.g. --freeze {world - 1}")
        return True
    if node not in nodes:
        raise ConfigError(f"{kind}: --{kind} {node}: the cluster of {handle.run_dir or handle.file} has no such node; "
                          f"its nodes: {listing}; e.g. --{kind} {list(nodes)[-1]}")
    return True


def owner(engines, handle: Handle):
    """The engine among engines (launcher/engines/base.py Engine) whose run handle is.

    Raises:
        ConfigError: none of them owns it, naming them.
    """
    for engine in engines:
        if engine.owns(handle):
            return engine
    raise ConfigError(f"chaos: {handle.file} is a run of none of the engines "
                      f"{', '.join(e.name for e in engines)}; pass the run folder of `launcher up`")


def chaos(kind: str, node: str, at_step: int, run_dir: str | None = None, file: str | None = None,
          project: str | None = None, wait_s: float = 3600.0, poll_s: float = 0.5, say=None, *,
          engines) -> int:
    """Wait for step at_step of the run, then apply ``kind`` to ``node`` (for ``freeze``, node is
    a global rank: its process is stopped in its node's container); returns the exit code.

    It says at once what it waits for (the run, the step, the node, the deadline). It waits for a
    run that is starting or running: when no container of the run exists, it says so and waits up
    to START_WAIT_S (or --wait-s when shorter) for ``launcher up`` to create them, then exits 1
    naming ``launcher up``; once they exist it waits (up to --wait-s) only while the node's
    container has not ended, and exits 1 when it ends, or all containers go, before the step.

    say: where its lines go, ``say(text, error)`` (default: printed, errors to stderr; simcluster.run
    keeps them in Run.chaos). engines: the engines whose runs it may act on (the table's, or the one
    running the job); the one that owns the run is asked for its Docker client (``attach``, the
    rehearsal hosts' on a run of ``up --hosts``) and its containers (``nodes``).

    Raises:
        ConfigError: no compose.yml in the run folder after that start window (or no --file).
    """
    check_args(kind, node, at_step, wait_s, run_dir)
    Handle.check_given(run_dir, file, project)  # before it waits: an empty flag or a dead link never appears
    say = say or _print
    t0 = time.monotonic()
    appear_by = t0 + min(wait_s, START_WAIT_S)
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + wait_s))
    named = f"run folder {run_dir}" if run_dir else f"compose file {file}" if file else "the newest run under runs/"
    checked = _check_early(kind, str(node), at_step, run_dir, file, project, engines)
    say(f"chaos: waiting for step {at_step} of {named} to {kind} {node}; giving up at {until} (--wait-s "
          f"{wait_s:g})", False)
    handle = _find_handle(run_dir, file, project, appear_by)
    checked = checked or check_node(kind, str(node), handle, {})  # from the run's record, before any wait
    say(f"chaos: that is project {handle.project} (run folder {handle.run_dir or '?'})", False)
    wait = _Wait(kind, node, at_step, wait_s, handle, owner(engines, handle), say, t0, appear_by, checked)
    while (code := wait.poll()) is None:
        time.sleep(poll_s)
    return code


def _check_early(kind: str, node: str, at_step: int, run_dir, file, project, engines) -> bool:
    """chaos's checks before it says anything or waits: a file of `generate` (no `up` will come), and
    a run folder that exists already, whose record names the nodes and the last step; whether the
    node was checked.

    Raises:
        ConfigError: any of them fails.
    """
    check_generated(kind, node, run_dir, file, project)  # a file of `generate`: no `up` will come
    try:  # a run folder that exists already: its record names the nodes before anything is said or waited for
        early = Handle.find(run_dir, file, project)
    except ConfigError:  # not there yet: `up` may be about to make it
        return False
    if not early.stack and early.run_dir and read_job(early.run_dir) is None \
            and not (runner := owner(engines, early)).nodes(early, runner.attach(early)):  # `up` writes job.json first
        raise ConfigError(f"--run-dir {run_dir or early.run_dir}: holds {os.path.basename(early.file)} but no job.json "
                          f"and no container of it runs: not a run folder of `python -m launcher up` (a file written "
                          f"by `generate`?), so none will appear; start it with launcher up --run-dir DIR, or for a cluster "
                          f"you started with docker compose pass --file {early.file}")
    checked = check_node(kind, node, early, {})
    check_step(at_step, early.run_dir, f"--{kind} {node}")
    return checked


class _Wait:
    """One chaos wait, polled: the run's containers found (through the engine's client), then the
    fault applied at the step, or the reason nothing was done. ``poll`` returns the exit code once
    it is known, else None (poll again after poll_s)."""

    def __init__(self, kind, node, at_step, wait_s, handle, engine, say, t0, appear_by, checked):
        self.kind, self.node, self.at_step, self.wait_s, self.say = kind, node, at_step, wait_s, say
        self.rank = int(node) if kind == "freeze" else None
        self.handle, self.engine, self.client = handle, engine, None
        self.t0, self.appear_by, self.deadline = t0, appear_by, t0 + wait_s
        self.checked, self.ever_running, self.seen, self.said, self.said_node = checked, False, False, False, False

    def poll(self) -> int | None:
        handle, engine = self.handle, self.engine
        if self.client is None or not self.client.hosts and handle.run_dir and engine.hosts(handle.run_dir) is not None:
            try:  # a run on rehearsal hosts (up --hosts): their daemons hold the task containers
                self.client = engine.attach(handle)
            except ConfigError:
                self.client = None  # its hosts are not up (yet, or any more)
        found = engine.nodes(handle, self.client) if self.client is not None else {}
        self.handle = handle.with_labels(found)
        return self._present(found) if found else self._absent()

    def _absent(self) -> int | None:
        """No container of the run: it ended (seen before), has not started in time, or may yet start."""
        project, say = self.handle.project, self.say
        if self.seen:
            say(f"chaos: the containers of project {project} are gone before step {self.at_step} (the run "
                  f"ended); nothing done", True)
            return 1
        if time.monotonic() > self.appear_by:
            say(f"chaos: no container of project {project} appeared within {self.appear_by - self.t0:g} s: "
                  f"nothing runs in {self.handle.run_dir or self.handle.file}; start it with `python -m launcher up "
                  f"--run-dir {self.handle.run_dir or 'DIR'} ...` and run chaos while it runs; nothing done", True)
            return 1
        if not self.said:
            say(f"chaos: no container of project {project} exists yet; waiting up to "
                  f"{self.appear_by - self.t0:g} s for `python -m launcher up` to start it", False)
            self.said = True
        return None

    def _present(self, found: dict) -> int | None:
        """The run's containers: the fault applied once the node runs at the step, 1 when it ended first."""
        kind, rank, at_step, handle, say = self.kind, self.rank, self.at_step, self.handle, self.say
        if not self.checked:
            self.checked = check_node(kind, str(rank) if rank is not None else self.node, handle, found)
        self.seen = True
        if rank is not None:
            self.node = node_of_rank(found, rank) or f"the node of rank {rank}"
        node, victim = self.node, found.get(self.node)
        nodes = sorted(s for s in found if s.startswith("node-"))
        first = found[nodes[0]] if nodes else None
        if victim is None and not self.said_node:  # not created yet (--start-late), or no such node
            say(f"chaos: no container {node} in project {handle.project} yet (it has {', '.join(nodes) or 'no node'})"
                  f"; waiting", False)
            self.said_node = True
        if victim is not None and victim.status == "running":
            self.ever_running = True
            step = last_step(handle.run_dir, _started_at(victim) - 1)
            source = METRICS
            if step is None and first is not None:
                step, source = log_step(first), "the log of " + nodes[0]
            if step is not None and step >= at_step:
                did = apply_fault(kind, victim, rank)
                say(f"chaos: {kind} {node} (container {victim.short_id}) at step {step} ({source}) "
                      f"t={time.time():.3f}: {did}", False)
                return 0
        elif self.ever_running or (victim is not None and victim.status in ("exited", "dead")):
            say(f"chaos: {node} is {victim.status if victim else 'gone'} before step {at_step}; nothing done", True)
            return 1
        if time.monotonic() > self.deadline:
            say(f"chaos: step {at_step} not reached within --wait-s {self.wait_s:g}; nothing done", True)
            return 1
        return None
