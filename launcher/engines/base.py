"""The contract of every engine (one class each, as torchx's Scheduler); ``up``'s own options are UpOptions
(job/sections.py).

    python -c "from simcluster.launcher.engines.registry import ENGINES; print({n: e.runs_here for n, e in ENGINES.items()})"

An ``Engine`` does, for one Launch (launcher/job/launch.py):
  ``check(launch, opts)``  refuse what it cannot do before anything is written or started
      (ConfigError naming the fix); opts None: ``generate`` (the job goes to other hosts), opts
      given: ``up`` here (one host: a local image is fine, at most this machine's CPUs per node);
  ``render(launch, command, out_path, project_dir) -> str``  its document, deterministic;
  ``up(launch, command, opts) -> int``  start, follow, summarise, take down: 0 every node exited 0,
      1 the run failed, 130 interrupted;
  ``status(handle)``, ``logs(handle, services, follow, tail)``, ``down(handle)``  a run of it
      (launcher/docker/handle.py), for the handles it ``owns``;
  ``attach(handle) -> Client``, ``nodes(handle, client)``, ``hosts(run_dir)``  what the drills ask
      of a run: the Docker client that reaches its containers (launcher/docker/client.py), its
      containers by service, its rehearsal hosts (None: one daemon).
What the doors ask of an engine is an attribute: ``runs_here`` (``up`` runs it on this machine),
``supports_chaos`` (drills/faults.py), ``supports_shaping`` (drills/shaping.py),
``instruments_user_code`` (--stall-s on your code, job/options.py), ``bind_mounts``
(host folders mounted into the nodes), ``default_path`` (where ``generate`` writes). ``RenderOnly``
is an engine that only renders here (JobSet, TrainJob): the rest raises ConfigError.
"""
from __future__ import annotations

import abc

from simcluster.launcher.docker.client import Client
from simcluster.launcher.engines.checks import common_problems, refuse
from simcluster.launcher.job.files import project_dir_for
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.job.sections import UpOptions  # noqa: F401 (every engine's up takes it)
from simcluster.core.errors import ConfigError


class Engine(abc.ABC):
    """One engine: what it refuses, its document, and its runs (see the module docstring).

    unsupported: the UpOptions fields this engine's ``up`` cannot honour -> what to do instead;
    check() refuses each one given."""

    name = ""
    default_path = ""  # where `generate` writes without --out, from the repo root; {job}: e.g. mesh-2x2x2
    runs_here = True
    supports_chaos = False
    supports_shaping = False
    bind_mounts = False
    supports_hosts = False  # --hosts N: rehearsal hosts (Swarm)
    instruments_user_code = True  # your code's ranks get the instruments (the node wrapper's), the stall watch too
    instruments_user_code_up = True  # and when `up` runs its document here (Slurm: its simulation adds them)
    unsupported: dict[str, str] = {}
    gpu_refusal = ""  # why `generate` refuses --gpu (the document cannot name a GPU model); "": it names it
    pulls_nothing = "runs the image of this machine's Docker and pulls none from a registry"  # why --push is refused
    reads: frozenset[str] = frozenset()  # the EngineOptions fields of a few engines (checks.py OWN) this one writes

    def pulls_image(self, launch: Launch) -> bool:
        """True when the document's nodes pull their image from a registry (--push then names it there)."""
        return self.registry_image(launch, False) is not None

    def out_path(self, job_name: str) -> str:
        """Where ``generate --target NAME`` writes without --out, relative to the repo root."""
        return self.default_path.format(job=job_name)

    def project_dir(self, launch: Launch, out: str) -> str:
        """Where the document's relative bind sources start: from its folder to the repo root."""
        return project_dir_for(out)

    def warnings(self, launch: Launch) -> list[str]:
        """What ``generate`` says on stderr but does not refuse."""
        return []

    def problems(self, launch: Launch, local: bool) -> list[str]:
        """This engine's own reasons to refuse the launch (each naming the fix); [] when none."""
        return []

    def registry_image(self, launch: Launch, local: bool) -> tuple[str, str] | None:
        """(flag, image) of an image other hosts pull, which must name a registry; None when none is."""
        return None

    def up_problems(self, launch: Launch, opts: UpOptions) -> list[str]:
        """What this engine's ``up`` refuses of opts: each option of ``unsupported`` set to other than its
        default, with why."""
        defaults = type(opts)()
        return [f"--{k.replace('_', '-')}: {why}" for k, why in self.unsupported.items()
                if getattr(opts, k) != getattr(defaults, k)]

    def check(self, launch: Launch, opts: UpOptions | None = None) -> None:
        """Refuse, before anything is written or started, what this engine cannot do with launch.

        opts: ``up``'s options when the job runs here, None for ``generate``.

        Raises:
            ConfigError: every problem found, each naming the option and the fix.
        """
        local = opts is not None
        errors = common_problems(self, launch, local) + self.problems(launch, local)
        if opts is not None:
            errors += self.up_problems(launch, opts)
        if errors:
            raise ConfigError("\n  ".join([f"--target {self.name}:", *errors]))

    @abc.abstractmethod
    def render(self, launch: Launch, command: str, out_path: str, project_dir: str) -> str:
        """The document's text. out_path: its path as typed from the repo root (named in its header);
        project_dir: from the file's folder to the repo root (relative bind sources start there)."""

    @abc.abstractmethod
    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """Start, follow, summarise, take down; returns the exit code (0, 1, 130).

        Raises:
            ConfigError: what only shows once the engine is asked (a stale cluster, no swarm mode).
            LauncherError: Docker or the engine failed.
        """

    def owns(self, handle) -> bool:
        """True when handle (launcher/docker/handle.py) is a run of this engine."""
        return False

    def attach(self, handle) -> Client:
        """The Docker client that reaches the containers of handle's run: this machine's daemon.

        Raises:
            ConfigError: the run's daemons are gone (an engine on rehearsal hosts).
        """
        return Client()

    def nodes(self, handle, client: Client) -> dict:
        """service -> container (every state) of handle's run, through client (attach's)."""
        return client.containers(handle.project, handle.stack)

    def hosts(self, run_dir: str):
        """The record of run_dir's rehearsal hosts (``.names``, host-0 first; ``.record``, the file that holds
        them), or None: the run is on one daemon (every engine but Swarm with --hosts)."""
        return None

    @abc.abstractmethod
    def status(self, handle) -> int:
        """Print the run's nodes and how it ended; the exit code."""

    @abc.abstractmethod
    def logs(self, handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
        """Print the run's logs (of services, all when empty); the exit code."""

    @abc.abstractmethod
    def down(self, handle) -> int:
        """Remove the run's containers and network; the exit code."""


class RenderOnly(Engine):
    """An engine this machine only renders for (its jobs run on a real cluster): ``up``, ``status``,
    ``logs`` and ``down`` raise ConfigError naming the engine and ``generate --target NAME``."""

    runs_here = False
    instruments_user_code = False  # its documents run your code's ranks with stock torchrun (document.py node_env)
    instruments_user_code_up = False
    tool = "kubectl"  # the engine's own tool, named in the refusal
    how = ""  # its commands there, in the refusal (default: kubectl's; checks.py refuse)

    def check(self, launch: Launch, opts: UpOptions | None = None) -> None:
        """generate: the engine's rules (Engine.check).

        Raises:
            ConfigError: the rules broken; for `up` (opts given) always: it cannot run here.
        """
        if opts is not None:
            raise refuse(self.name, "up", self.tool, self.how)
        super().check(launch, None)

    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """Raises ConfigError: the engine cannot run here."""
        raise refuse(self.name, "up", self.tool, self.how)

    def status(self, handle) -> int:
        """Raises ConfigError: the engine's runs are not on this machine."""
        raise refuse(self.name, "status", self.tool, self.how)

    def logs(self, handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
        """Raises ConfigError: the engine's runs are not on this machine."""
        raise refuse(self.name, "logs", self.tool, self.how)

    def down(self, handle) -> int:
        """Raises ConfigError: the engine's runs are not on this machine."""
        raise refuse(self.name, "down", self.tool, self.how)
