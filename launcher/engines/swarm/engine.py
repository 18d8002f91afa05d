"""The Swarm engine: the Compose services as a Docker Swarm stack (c10d rendezvous), one-node here.

    python -m launcher generate --mesh 2x2x2 --target swarm --stdout

Its document is render.py's, its ``up`` run.py's (a one-node swarm made and left). ``up`` removes
the stack when it ends, so ``status``, ``logs`` and ``down`` act on a stack still up (one deployed
by hand from the generated file, or an ``up`` in progress) and otherwise name the stack commands.
"""
from __future__ import annotations

import posixpath

from simcluster.launcher.docker import cluster
from simcluster.launcher.docker.client import Client, LauncherError
from simcluster.launcher.docker.container import log_text
from simcluster.launcher.engines.base import Engine, UpOptions
from simcluster.launcher.engines.checks import has_registry
from simcluster.launcher.docker.compose_cli import stack_cli
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.engines.swarm import hosts as rehearsal
from simcluster.launcher.engines.swarm import render, rehearse, run
from simcluster.launcher.job.files import project_dir_for
from simcluster.launcher.job.launch import Launch
from simcluster.core.errors import ConfigError


class Swarm(Engine):
    """A Docker Swarm stack (see the module docstring)."""

    name = "swarm"
    default_path = "swarm/{job}.yml"
    bind_mounts = True
    supports_hosts = True
    reads = frozenset({"workdir"})
    unsupported = run.UNSUPPORTED  # --inter-node-bandwidth: refused by drills/shaping.py (supports_shaping)
    gpu_refusal = ("a stack reserves GPUs as a count of the NVIDIA-GPU generic resource and cannot name a model; pin "
                   "the nodes to hosts of that GPU with deploy.placement.constraints instead")

    def pulls_image(self, launch: Launch) -> bool:
        """A stack's tasks pull the image on every host of a real swarm (--push names it there)."""
        return True

    def project_dir(self, launch: Launch, out: str) -> str:
        """--workdir (the checkout on shared storage) when given, else from the file's folder to the repo root."""
        return launch.engine.workdir or project_dir_for(out)

    def problems(self, launch: Launch, local: bool) -> list[str]:
        """--workdir must be absolute (swarm bind sources are host paths); --inter-host-bandwidth is applied by
        ``up`` on its rehearsal hosts (tc in each host's engine container), never by a stack file."""
        errors = []
        if not local and launch.engine.inter_host_bandwidth:
            errors.append(f"--inter-host-bandwidth {launch.engine.inter_host_bandwidth}: applied by `python -m launcher "
                          f"up --target swarm --hosts N` to its rehearsal hosts (tc on each host's link); a stack file "
                          f"alone cannot apply it, and generate would drop it: use launcher up, or drop the option")
        if launch.engine.workdir and not posixpath.isabs(launch.engine.workdir):
            errors.append(f"--workdir {launch.engine.workdir}: swarm bind mounts need an absolute host path; give the "
                          f"checkout's absolute path on shared storage, e.g. --workdir /shared/me/simcluster")
        if launch.engine.hosts is not None and launch.engine.hosts > launch.nnodes:
            errors.append(f"--hosts {launch.engine.hosts}: more hosts than the job's {launch.nnodes} node(s) (a host "
                          f"would run nothing); e.g. --hosts {launch.nnodes}")
        return errors

    def up_problems(self, launch: Launch, opts: UpOptions) -> list[str]:
        """run.UNSUPPORTED's options, less --keep (it keeps them, and the stack) and --max-restarts (on the
        hosts left) on rehearsal hosts (rehearse.py)."""
        return [p for p in super().up_problems(launch, opts)
                if not (launch.engine.hosts and p.startswith(("--keep:", "--max-restarts:")))]

    def warnings(self, launch: Launch) -> list[str]:
        """An image that names no registry: fine on a one-node swarm (``up`` refuses it on several)."""
        if has_registry(launch.node.image):
            return []
        return [f"--image {launch.node.image} names no registry: fine on a one-node swarm; on several hosts push it "
                f"to a registry (--image registry.example.com/{launch.node.image}) or copy it to every host "
                f"(docker save {launch.node.image} | ssh HOST docker load)"]

    def render(self, launch: Launch, command: str, out_path: str, project_dir: str) -> str:
        """The stack file (render.py)."""
        return render.render(launch, command, out_path, project_dir)

    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """run.py up: deploy, follow, summarise, remove; the exit code.

        Raises:
            ConfigError: no usable swarm engine, a worker node, a local image on several nodes, the stack up.
            LauncherError: the engine failed, or a task did not start.
        """
        if launch.engine.hosts:
            return rehearse.up(launch, command, opts)
        return run.up(launch, command, opts)

    def owns(self, handle: Handle) -> bool:
        """A swarm stack's handle (RUN_DIR/stack.yml)."""
        return handle.stack

    def attach(self, handle: Handle) -> Client:
        """The Docker client of the run's rehearsal hosts still up when it had some (rehearse.attach), else this
        machine's daemon.

        Raises:
            ConfigError: the run had hosts and none is up.
        """
        return (rehearse.attach(handle.run_dir) if handle.run_dir else None) or Client()

    def hosts(self, run_dir: str) -> rehearsal.Rehearsal | None:
        """The run's rehearsal hosts (RUN_DIR/hosts.json, hosts.read), or None.

        Raises:
            ConfigError: the record is not what `up --hosts` writes.
        """
        return rehearsal.read(run_dir)

    def _live(self, handle: Handle, command: str) -> Client:
        """The Docker client of the stack (attach), while it is up.

        Raises ConfigError: the stack is not up (`up` removes it when it ends), naming the stack commands."""
        client = self.attach(handle)
        try:
            up = bool(cluster.stack_tasks(client, handle.project))
        except LauncherError:
            up = False
        if not up:
            raise ConfigError(f"{handle.run_dir}: a swarm run (stack {handle.project}, removed when its `up` ends) "
                              f"that is not up; `{command}` acts on a stack still up; use docker stack ps "
                              f"{handle.project}, docker service logs {handle.project}_node-0, docker stack rm "
                              f"{handle.project}")
        return client

    def status(self, handle: Handle) -> int:
        """``docker stack ps`` of the stack; its exit code.

        Raises:
            ConfigError: the stack is not up.
        """
        client = self._live(handle, "status")
        proc = stack_cli(client, "ps", handle.project, check=False)
        print((proc.stdout or proc.stderr).rstrip())
        return proc.returncode

    def logs(self, handle: Handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
        """Each task container's log (of services, all when empty), prefixed ``SERVICE |``; 0.

        Raises:
            ConfigError: the stack is not up, or --follow (name the stack's own command).
        """
        client = self._live(handle, "logs")
        if follow:
            raise ConfigError(f"logs --follow: a swarm stack's log is followed with docker service logs --follow "
                              f"{handle.project}_SERVICE (e.g. {handle.project}_node-0)")
        for service, container in sorted(self.nodes(handle, client).items()):
            if not services or service in services:
                for line in log_text(container, tail if tail == "all" else int(tail)).splitlines():
                    print(f"{service} | {line}")
        return 0

    def down(self, handle: Handle) -> int:
        """``docker stack rm``, waiting until its containers and network are gone, then the run's rehearsal
        hosts when it had some (kept by ``up --keep``); 0.

        Raises:
            ConfigError: the stack is not up (and no hosts of the run are).
        """
        if rehearsal.read(handle.run_dir) is not None:
            try:
                client = rehearse.attach(handle.run_dir)
                if client and cluster.stack_tasks(client, handle.project):
                    run.remove_stack(client, handle.project)
            finally:
                rehearsal.take_down(print)
            return 0
        run.remove_stack(self._live(handle, "down"), handle.project)
        return 0
