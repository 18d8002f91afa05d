"""The Slurm engine: an sbatch script; here, a simulated Slurm cluster in containers runs it.

    python -m launcher generate --mesh 2x2x2 --target slurm --stdout

Its document is render.py's, its ``up`` run.py's (slurmctld + slurmd containers, sbatch), which
removes the simulation when the job ends: ``status``, ``logs`` and ``down`` have nothing to act on
and say where the job's output is.
"""
from __future__ import annotations

from simcluster.launcher.engines.base import Engine, UpOptions
from simcluster.launcher.engines.slurm import render, run
from simcluster.launcher.job.launch import Launch
from simcluster.core.errors import ConfigError


class Slurm(Engine):
    """Slurm (see the module docstring)."""

    name = "slurm"
    default_path = "slurm/{job}.sbatch"
    instruments_user_code = False  # the batch script: stock torchrun on each node, no node wrapper
    instruments_user_code_up = True  # the simulation's sbatch exports them (run.py submit_env)
    unsupported = run.UNSUPPORTED

    def registry_image(self, launch: Launch, local: bool) -> tuple[str, str] | None:
        """--container-image (pyxis/enroot pulls it on every node), when given."""
        return ("--container-image", launch.engine.container_image) if launch.engine.container_image else None

    def render(self, launch: Launch, command: str, out_path: str, project_dir: str) -> str:
        """The batch script (render.py)."""
        return render.render(launch, command, out_path, project_dir)

    def up(self, launch: Launch, command: str, opts: UpOptions) -> int:
        """run.py up: the simulation, sbatch, the job followed and summarised, everything removed; the exit code.

        Raises:
            LauncherError: Docker failed, or the job did not run.
        """
        return run.up(launch, command, opts)

    def _gone(self, command: str) -> ConfigError:
        return ConfigError(f"--target slurm: `{command}` has no Slurm run to act on here: `launcher up --target "
                           f"slurm` removes its simulation when the job ends; the job's output is RUN_DIR/"
                           f"JOB-ID.out and RUN_DIR/cluster.log (on a real cluster: squeue, sacct, scancel)")

    def status(self, handle) -> int:
        """Raises ConfigError: nothing of a Slurm run outlives its `up`."""
        raise self._gone("status")

    def logs(self, handle, services: list[str], follow: bool = False, tail: str = "all") -> int:
        """Raises ConfigError: nothing of a Slurm run outlives its `up`."""
        raise self._gone("logs")

    def down(self, handle) -> int:
        """Raises ConfigError: nothing of a Slurm run outlives its `up`."""
        raise self._gone("down")
