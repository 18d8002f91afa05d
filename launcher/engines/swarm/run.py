"""``launcher up --target swarm``: the generated stack on a Docker Swarm, followed, summarised, removed.

    python -m launcher up --target swarm --mesh 2x2x2 --model tiny --steps 3 [--mount-code]

Checks first (exit 2, nothing started): the docker CLI is there (``docker stack deploy``; the
SDK has no stack API), the engine answers and has swarm mode, this engine is a manager when it
is in a swarm, a swarm of several nodes gets an image a registry serves, no stack of this run
folder is up. Then: the run folder (made for the containers' user), RUN_DIR/stack.yml
(render.py with absolute bind sources), a one-node swarm when the engine is in
none (``docker swarm init --advertise-addr 127.0.0.1``), ``docker stack deploy --resolve-image
never``, every task's container followed as Compose's are (launcher/observe/follow.py: the same lines,
progress, lost-node watch) and the same summary (launcher/observe/summary.py); exit 0 only if every node
exited 0. Always at the end (success, failure, Ctrl-C = 130, SIGTERM): ``docker stack rm``,
waiting until its containers and network are gone, and, when this run made the swarm,
``docker swarm leave --force`` and the docker_gwbridge network the swarm made: the engine is
left as found. Engine restarts are off (restart_policy none): ``--max-restarts`` is refused.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from simcluster.launcher.docker import cluster
from simcluster.launcher.docker.compose_cli import stack_cli
from simcluster.launcher.docker.client import STACK_LABEL, Client, LauncherError
from simcluster.launcher.job.files import ROOT, make_run_dir, write_atomic
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import IMAGE
from simcluster.launcher.engines.base import UpOptions
from simcluster.launcher.engines.skeleton import follow_and_summarise, kill_all, open_stream
from simcluster.launcher.engines.deps_image import with_image
from simcluster.launcher.engines.image import check_image, ensure_image
from simcluster.launcher.engines.swarm import render as swarm
from simcluster.launcher.engines.checks import has_registry, no_registry
from simcluster.core.errors import ConfigError

ADVERTISE_ADDR = "127.0.0.1"  # a one-node swarm: nothing outside this machine joins it
GWBRIDGE = "docker_gwbridge"  # the bridge a swarm node makes for its tasks (ours attach none of it)
START_TIMEOUT_S = 120.0  # every task has a container by then, or the run fails naming the task
GONE_TIMEOUT_S = 60.0  # `docker stack rm` is asynchronous: wait this long for containers and network


def swarm_info(client: Client) -> dict:
    """The daemon's ``Swarm`` facts (LocalNodeState, ControlAvailable, Nodes, Error).

    Raises:
        ConfigError: no docker CLI, no engine answers, or the engine has no swarm mode.
    """
    if shutil.which("docker") is None:
        raise ConfigError("--target swarm: `docker stack deploy` needs the docker CLI, which is not on PATH; install "
                          "it (Debian: apt-get install docker.io) or use --target compose")
    try:
        info = client.info()
    except LauncherError as e:
        raise ConfigError(f"--target swarm: {e}") from None
    sw = info.get("Swarm")
    if not isinstance(sw, dict) or "LocalNodeState" not in sw:
        raise ConfigError("--target swarm: this engine has no swarm mode (`docker info` shows no Swarm section); "
                          "use Docker Engine (docker.io, docker-ce) or --target compose")
    return sw


def check_swarm_image(launch: Launch, swarm_nodes: int) -> None:
    """`up --target swarm`: a swarm of several nodes needs an image a registry serves.

    Raises:
        ConfigError: swarm_nodes > 1 and the image names no registry.
    """
    if swarm_nodes > 1 and not has_registry(launch.node.image):
        raise ConfigError("--target swarm:\n  " + no_registry(
            "--image", launch.node.image, f"this swarm has {swarm_nodes} nodes, so tasks may run on "
            f"other hosts") + "; an image you copied to every host (docker save | docker load) runs with the "
            "generated stack: python -m launcher generate --target swarm, then docker stack deploy")


def check_engine(client: Client, launch: Launch, stack: str) -> dict:
    """Everything `up --target swarm` needs before it starts anything; returns swarm_info().

    Raises:
        ConfigError: a missing or unusable engine, a worker node, a swarm node in a bad state, a
            local image on a multi-node swarm, or this run folder's stack still up.
    """
    sw = swarm_info(client)
    state = sw["LocalNodeState"]
    if state not in ("inactive", "active"):
        raise ConfigError(f"--target swarm: this engine's swarm state is {state!r} ({sw.get('Error') or 'no error'}); "
                          f"wait until it is active, or `docker swarm leave --force` and rerun (a one-node swarm "
                          f"is made then)")
    if state == "active" and not sw.get("ControlAvailable"):
        raise ConfigError("--target swarm: this engine is a swarm worker, and stacks are deployed from a manager; "
                          "run there (`docker node ls` lists them), or `docker swarm leave` here for a one-node swarm")
    check_swarm_image(launch, int(sw.get("Nodes") or 1) if state == "active" else 1)
    if state == "active" and cluster.stack_tasks(client, stack):
        raise ConfigError(f"run_dir: the stack of {launch.run_dir} ({stack}) is still up; remove it with "
                          f"`docker stack rm {stack}` or pass another --run-dir")
    return sw


UNSUPPORTED = {  # `up` options only the Compose engine implements, with what to do instead
    "build": "the stack runs the trainer image as it is (built only when missing); rebuild it first with python -m "
             "launcher build --force, or use --target compose",
    "max_restarts": "the stack runs with restart_policy none (each node runs once); run again with --ckpt-every N "
                    "--resume auto, or use --target compose (whole-cluster restarts)",
    "start_late": "a stack starts every service at once; use --target compose for late-join drills",
    "keep": "the stack is always removed (docker service logs while it runs; cluster.log keeps every line)",
}


def up(launch: Launch, command: str, opts: UpOptions, client: Client | None = None) -> int:
    """Deploy, follow, summarise, remove (see the module docstring); returns the exit code.

    client: the rehearsal hosts' Docker client (swarm/rehearse.py), whose hosts hold launch's image
    already; with opts.keep the stack is then left for status, logs and down. None: this machine's
    daemon (the image made here first).

    Raises:
        ConfigError: see check_engine(); the image probe (engines/image.py check_image).
        LauncherError: the engine failed, or a task did not start (the stack is removed first).
    """
    t0 = time.monotonic()
    hosted = client is not None
    client = client or Client()
    handle = Handle.for_stack(launch.run_dir)
    sw = check_engine(client, launch, handle.project)
    if not hosted:
        launch = prepare_image(launch)
    run_dir = handle.run_dir
    make_run_dir(run_dir, launch.node.user, launch.record())
    write_atomic(handle.file, swarm.render(launch, command, handle.file, ROOT))
    made_swarm, had_gwbridge = sw["LocalNodeState"] == "inactive", cluster.network(client, GWBRIDGE) is not None
    print(f"launcher: {launch.layout}; run folder "
          f"{launch.run_dir}; swarm stack {handle.project} ({os.path.relpath(handle.file)})", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also removes the stack
    stream = open_stream(launch, run_dir, opts)
    inited, code = False, 1
    try:
        if made_swarm:
            try:
                cluster.swarm_init(client, ADVERTISE_ADDR)
            except LauncherError as e:
                raise ConfigError(f"--target swarm: {e}; fix the engine or use --target compose") from None
            inited = True
            stream.show(f"launcher: made a one-node swarm (advertise {ADVERTISE_ADDR}); it is left at the end")
        since = time.time()
        stack_cli(client, "deploy", "--resolve-image", "never", "-c", handle.file, handle.project)
        found = _task_containers(client, handle.project, ["rendezvous", *launch.names])
        stream.show(f"launcher: stack deployed, {len(found)} tasks started after {time.monotonic() - t0:.1f}s")
        code, _ = follow_and_summarise(client, stream, launch, handle, found, run_dir, since, t0, opts)
    except KeyboardInterrupt:
        print("\nlauncher: interrupted; removing the stack", file=sys.stderr, flush=True)
        kill_all(client, handle)  # at once, then the stack
        code = 130
    finally:
        kept = hosted and opts.keep
        if (inited or sw["LocalNodeState"] == "active") and not kept:
            remove_stack(client, handle.project)
        if inited:
            cluster.swarm_leave(client)
            if not had_gwbridge:
                cluster.remove_network(client, GWBRIDGE)
        print(f"launcher: stack {handle.project} " + ("kept (--keep)" if kept else "removed")
              + ("; swarm left, as found" if inited else "") + f" ({time.monotonic() - t0:.1f}s)", flush=True)
    return code


def prepare_image(launch: Launch) -> Launch:
    """The trainer image ensured (built when missing) and --requirements' derived image made; the launch
    naming the image its nodes run, probed for what every node needs (engines/image.py check_image).

    Raises:
        ConfigError: the image lacks what a node needs. LauncherError: a build failed.
    """
    if launch.node.image == IMAGE:
        ensure_image(IMAGE, False, launch.node.mount_code)
    launch = with_image(launch)  # --requirements: the derived image, FROM the one just ensured
    check_image(launch)
    return launch


def _task_containers(client: Client, stack: str, services: list[str], timeout_s: float = START_TIMEOUT_S) -> dict:
    """service -> the container of its task, once every service's task has one.

    Raises:
        LauncherError: a task was rejected or failed before it had a container (the engine's
            reason: a missing image, a bind source that does not exist), or timeout_s passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found, states, problems = {}, {}, []
        for name, tasks in cluster.stack_tasks(client, stack).items():
            if not tasks:
                continue
            status = tasks[-1]["Status"]
            states[name] = status["State"]
            cid = (status.get("ContainerStatus") or {}).get("ContainerID")
            if status["State"] in ("rejected", "failed") and not cid:
                problems.append(f"{name}: task {status['State']}: {status.get('Err') or status.get('Message')}")
            elif cid and status["State"] not in ("new", "pending", "assigned", "accepted", "preparing"):
                container = client.container_by_id(cid)
                if container is not None:
                    found[name] = container
        if problems:
            raise LauncherError("swarm task(s) did not start: " + "; ".join(problems))
        if set(found) >= set(services):
            return {s: found[s] for s in services}
        if time.monotonic() > deadline:
            raise LauncherError(f"swarm tasks without a container after {timeout_s:.0f}s: "
                                + ", ".join(f"{s} {states.get(s, 'no task')}" for s in services if s not in found))
        time.sleep(0.3)


def remove_stack(client: Client, stack: str, timeout_s: float = GONE_TIMEOUT_S) -> None:
    """``docker stack rm``, then wait until its task containers and network are gone (removing
    what is left after timeout_s)."""
    stack_cli(client, "rm", stack, check=False)
    label = f"{STACK_LABEL}={stack}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(cluster.labelled(client, label)):
            return
        time.sleep(0.5)
    cluster.remove_labelled(client, label)
