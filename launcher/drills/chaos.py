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

from simcluster.launcher.engines import docker as engine
from simcluster.launcher.engines.docker import LauncherError
from simcluster.launcher.observe.progress import parse_step, split_rank
from simcluster.launcher.container.layout import LABEL, RDZV_HOST
from simcluster.train.layout import node_names, rank_range
from simcluster.train.rundir import METRICS, last_step
from simcluster.train.runlog import read_job
from simcluster.launcher.engines.handle import Handle
from simcluster.launcher.engines.swarm.hosts import HOSTS_FILE
from simcluster.launcher.engines.swarm.rehearse import attach
from simcluster.train.errors import ConfigError

FAULTS = ("kill", "stop", "pause", "disconnect", "freeze")
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
    for line in engine.log_text(container, tail=300).splitlines():
        rank, text = split_rank(line)
        parsed = parse_step(text) if rank == 0 else None
        if parsed:
            step = max(step or 0, int(parsed["step"]))
    return step


def _find_target(run_dir, file, project, deadline: float) -> Handle:
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
        rc, text = engine.exec_in(container, ["python", "-m", "simcluster.launcher.container.ranks", "--rank",
                                              str(rank), "--first-rank", first, "--signal", "STOP"])
        if rc != 0:
            raise LauncherError(f"freeze of rank {rank} failed: {text.strip()}")
        return text.strip()
    if kind == "kill":
        engine.kill(container, strict=True)
        return "kill"
    if kind == "stop":
        engine.stop(container, 10)
        return "stop (SIGTERM, then SIGKILL after 10 s)"
    if kind == "pause":
        engine.pause(container)  # retried: runc's freeze can fail transiently while a process forks
        return "pause"
    nets = engine.disconnect(container)
    if not nets:
        raise LauncherError(f"container {container.short_id} is on no network")
    return "network disconnect " + ", ".join(nets)


def check_args(kind: str, node: str, at_step: int, wait_s: float, run_dir: str | None) -> None:
    """The fault's own inputs, before anything waits.

    Raises:
        ConfigError: an unknown kind, a step below 1, a --wait-s not a finite number > 0, a rank
            below 0 (freeze), an empty node name, a --run-dir that is a file.
    """
    if kind not in FAULTS:
        raise ConfigError(f"chaos: unknown fault {kind!r}; choose one of {', '.join(FAULTS)}")
    if isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 1:
        raise ConfigError(f"at_step: --at-step {at_step!r} is not a step (steps count from 1, the first "
                          f"finished step); e.g. --at-step 5")
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not (0 < wait_s < float("inf")):
        raise ConfigError(f"wait_s: --wait-s {wait_s!r} must be a finite number of seconds > 0; e.g. --wait-s 600")
    if kind == "freeze" and not (str(node).isdigit()):
        raise ConfigError(f"freeze: --freeze {node} is not a global rank (an integer >= 0); e.g. --freeze 1")
    if kind != "freeze" and not str(node).strip():
        raise ConfigError(f"{kind}: --{kind} {node!r} names no node; e.g. --{kind} node-1")
    if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"--run-dir {run_dir}: a file, not a folder; pass the run folder of `launcher up`, "
                          f"e.g. --run-dir runs/mesh-2x2x2")


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


def cluster_nodes(target: Handle, found: dict) -> tuple[dict[str, str], int] | None:
    """({node: its ranks "4-7"}, world size) of the run: its record (RUN_DIR/job.json, written by
    `up`), else its rendezvous container's labels (nnodes, nproc-per-node) once found; None for a
    cluster that names neither (another compose file's)."""
    if (job := read_job(target.run_dir)) is not None:
        return job["nodes"], job["world_size"]
    labels = found[RDZV_HOST].labels if RDZV_HOST in found else {}
    nnodes, nproc = labels.get(LABEL + "nnodes", ""), labels.get(LABEL + "nproc-per-node", "")
    if not (nnodes.isdigit() and nproc.isdigit()):
        return None
    nodes = {name: rank_range(k, int(nproc)) for k, name in enumerate(node_names(int(nnodes)))}
    return nodes, int(nnodes) * int(nproc)


def check_node(kind: str, node: str, target: Handle, found: dict) -> bool:
    """Whether the cluster's nodes are known yet (cluster_nodes); when they are, the node (or, for
    freeze, the rank) must be one of them.

    Raises:
        ConfigError: it is not, listing the cluster's nodes (and their ranks).
    """
    known = cluster_nodes(target, found)
    if known is None:
        return False
    nodes, world = known
    listing = ", ".join(f"{n} (ranks {r})" for n, r in nodes.items())
    if kind == "freeze":
        if not int(node) < world:
            raise ConfigError(f"freeze: --freeze {node}: the cluster of {target.run_dir or target.file} has ranks "
                              f"0-{world - 1} ({listing}); e.g. --freeze {world - 1}")
        return True
    if node not in nodes:
        raise ConfigError(f"{kind}: --{kind} {node}: the cluster of {target.run_dir or target.file} has no such node; "
                          f"its nodes: {listing}; e.g. --{kind} {list(nodes)[-1]}")
    return True


def chaos(kind: str, node: str, at_step: int, run_dir: str | None = None, file: str | None = None,
          project: str | None = None, wait_s: float = 3600.0, poll_s: float = 0.5, say=None) -> int:
    """Wait for step at_step of the run, then apply ``kind`` to ``node`` (for ``freeze``, node is
    a global rank: its process is stopped in its node's container); returns the exit code.

    It says at once what it waits for (the run, the step, the node, the deadline). It waits for a
    run that is starting or running: when no container of the run exists, it says so and waits up
    to START_WAIT_S (or --wait-s when shorter) for ``launcher up`` to create them, then exits 1
    naming ``launcher up``; once they exist it waits (up to --wait-s) only while the node's
    container has not ended, and exits 1 when it ends, or all containers go, before the step.

    say: where its lines go, ``say(text, error)`` (default: printed, errors to stderr; simcluster.run
    keeps them in Run.chaos).

    Raises:
        ConfigError: no compose.yml in the run folder after that start window (or no --file).
    """
    check_args(kind, node, at_step, wait_s, run_dir)
    say = say or _print
    rank = int(node) if kind == "freeze" else None
    t0 = time.monotonic()
    deadline, appear_by = t0 + wait_s, t0 + min(wait_s, START_WAIT_S)
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + wait_s))
    named = f"run folder {run_dir}" if run_dir else f"compose file {file}" if file else "the newest run under runs/"
    try:  # a run folder that exists already: its record names the nodes before anything is said or waited for
        early = Handle.find(run_dir, file, project)
    except ConfigError:  # not there yet: `up` may be about to make it
        early = None
    if early is not None and not early.stack and early.run_dir and read_job(early.run_dir) is None \
            and not engine.containers(early.project, early.stack):  # `up` writes job.json before compose.yml
        raise ConfigError(f"--run-dir {run_dir or early.run_dir}: holds {os.path.basename(early.file)} but no job.json "
                          f"and no container of it runs: not a run folder of `python -m launcher up` (a file written "
                          f"by `generate`?), so none will appear; start it with launcher up --run-dir DIR, or for a cluster "
                          f"you started with docker compose pass --file {early.file}")
    checked = early is not None and check_node(kind, str(node), early, {})
    if early is not None:
        check_step(at_step, early.run_dir, f"--{kind} {node}")
    say(f"chaos: waiting for step {at_step} of {named} to {kind} {node}; giving up at {until} (--wait-s "
          f"{wait_s:g})", False)
    target = _find_target(run_dir, file, project, appear_by)
    checked = checked or check_node(kind, str(node), target, {})  # from the run's record, before any wait
    say(f"chaos: that is project {target.project} (run folder {target.run_dir or '?'})", False)
    ever_running = seen = said = said_node = on_hosts = False
    while True:
        if target.stack and not on_hosts and os.path.isfile(os.path.join(target.run_dir or "", HOSTS_FILE)):
            try:  # a run on rehearsal hosts (up --hosts): their engines hold the task containers
                on_hosts = attach(target.run_dir)
            except ConfigError:
                pass  # not up (yet, or any more)
        found = engine.containers(target.project, target.stack)
        target = target.with_labels(found)
        if not found:
            if seen:
                say(f"chaos: the containers of project {target.project} are gone before step {at_step} (the run "
                      f"ended); nothing done", True)
                return 1
            if time.monotonic() > appear_by:
                say(f"chaos: no container of project {target.project} appeared within {appear_by - t0:g} s: "
                      f"nothing runs in {target.run_dir or target.file}; start it with `python -m launcher up "
                      f"--run-dir {target.run_dir or 'DIR'} ...` and run chaos while it runs; nothing done", True)
                return 1
            if not said:
                say(f"chaos: no container of project {target.project} exists yet; waiting up to "
                      f"{appear_by - t0:g} s for `python -m launcher up` to start it", False)
                said = True
            time.sleep(poll_s)
            continue
        if not checked:
            checked = check_node(kind, str(rank) if rank is not None else node, target, found)
        seen = True
        if rank is not None:
            node = node_of_rank(found, rank) or f"the node of rank {rank}"
        victim = found.get(node)
        nodes = sorted(s for s in found if s.startswith("node-"))
        first = found[nodes[0]] if nodes else None
        if victim is None and not said_node:  # not created yet (--start-late), or no such node
            say(f"chaos: no container {node} in project {target.project} yet (it has {', '.join(nodes) or 'no node'})"
                  f"; waiting", False)
            said_node = True
        if victim is not None and victim.status == "running":
            ever_running = True
            step = last_step(target.run_dir, _started_at(victim) - 1)
            source = METRICS
            if step is None and first is not None:
                step, source = log_step(first), "the log of " + nodes[0]
            if step is not None and step >= at_step:
                did = apply_fault(kind, victim, rank)
                say(f"chaos: {kind} {node} (container {victim.short_id}) at step {step} ({source}) "
                      f"t={time.time():.3f}: {did}", False)
                return 0
        elif ever_running or (victim is not None and victim.status in ("exited", "dead")):
            say(f"chaos: {node} is {victim.status if victim else 'gone'} before step {at_step}; nothing done", True)
            return 1
        if time.monotonic() > deadline:
            say(f"chaos: step {at_step} not reached within --wait-s {wait_s:g}; nothing done", True)
            return 1
        time.sleep(poll_s)
