"""The Compose engine: the simulation this machine runs (one container per node and a rendezvous).

    python -m launcher generate --mesh 2x2x2 --target compose --stdout

Its document is render.py's, its ``up`` run.py's (restarts, late starts, shaping), its status,
logs and down status.py's. The only engine that takes faults (drills/faults.py) and shapes the
network (drills/shaping.py).
"""
from __future__ import annotations

from simcluster.launcher.engines.base import Engine, UpOptions
from simcluster.launcher.engines.compose import run, status
from simcluster.launcher.engines.compose.render import render
from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.job.launch import Launch


class Compose(Engine):
    """The Compose simulation (see the module docstring)."""

    name = "compose"
    default_path = "compose/{job}.yml"
    supports_chaos = True
    supports_shaping = True
    bind_mounts = True

    def render(self, launch: Launch, command: str, out_path: str, project_dir: str) -> str:
        """The compose file (render.py)."""
        return render(launch, command, out_path, project_dir)

    def up_problems(self, launch: Launch, opts: UpOptions) -> list[str]:
        """--max-restarts >= 0, --start-late names nodes of the launch."""
        return run.up_problems(launch, opts)

    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """run.py up: a fresh cluster, restarted up to opts.max_restarts times; the exit code.

        Raises:
            ConfigError: the run folder's cluster is still up.
            LauncherError: Docker or Compose failed.
        """
        return run.up(launch, command, opts)

    def owns(self, handle: Handle) -> bool:
        """A compose project's handle (not a swarm stack's)."""
        return not handle.stack

    def status(self, handle: Handle) -> int:
        """The nodes' table and how the run ended (status.py); 0."""
        return status.status(self.attach(handle), handle)

    def logs(self, handle: Handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
        """``compose logs``; its exit code."""
        return status.logs(handle, services, follow=follow, tail=tail)

    def down(self, handle: Handle) -> int:
        """``compose down``; its exit code."""
        return status.down(handle)
