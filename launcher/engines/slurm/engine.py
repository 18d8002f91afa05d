"""The Slurm engine: an sbatch script; here, a simulated Slurm cluster in containers runs it.

    python -m launcher generate --mesh 2x2x2 --target slurm --stdout

Its document is render.py's, its ``up`` run.py's (slurmctld + slurmd containers, sbatch), which
removes the simulation when the job ends: ``status``, ``logs`` and ``down`` have nothing to act on
and say where the job's output is.
"""
from __future__ import annotations

from simcluster.launcher.engines.base import Engine, UpOptions
from simcluster.launcher.engines.slurm import render, run
from simcluster.launcher.container.layout import IMAGE
from simcluster.launcher.job.launch import Launch
from simcluster.core.errors import ConfigError


class Slurm(Engine):
    """Slurm (see the module docstring)."""

    name = "slurm"
    default_path = "slurm/{job}.sbatch"
    instruments_user_code = False  # the batch script: stock torchrun on each node, no node wrapper
    instruments_user_code_up = True  # the simulation's sbatch exports them (run.py submit_env)
    unsupported = run.UNSUPPORTED

    reads = frozenset({"pyxis", "container_image", "workdir", "setup"})
    pulls_nothing = "without --pyxis runs no image (the venv line); add --pyxis"

    def registry_image(self, launch: Launch, local: bool) -> tuple[str, str] | None:
        """The image pyxis pulls on every node (--container-image, or --image with --pyxis), when one is run."""
        image = render.container_image(launch)
        return (("--container-image" if launch.engine.container_image else "--image"), image) if image else None

    def problems(self, launch: Launch, local: bool) -> list[str]:
        """--container-image and --image naming two images (the one rehearsed here must be the one that runs);
        --container-image with --push (the pushed name is the image); pyxis in `up` (the simulation has none)."""
        eng, image = launch.engine, launch.node.image
        if eng.container_image and eng.push:
            return [f"--container-image {eng.container_image}: --push names the image pyxis runs (the one pushed); "
                    f"drop --container-image and pass --pyxis"]
        if local and render.container_image(launch):
            return [f"--{'container-image' if eng.container_image else 'pyxis'}: the simulated Slurm here has no pyxis "
                    f"(its nodes run the image rehearsed, the Slurm image built FROM it); drop it for `up`, keep it for "
                    f"`generate`"]
        if eng.container_image and image != IMAGE and not render.same_image(eng.container_image, image):
            return [f"--container-image {eng.container_image} and --image {image} name two images: the image rehearsed "
                    f"here is the one that should run there; give one, e.g. --image {image} --pyxis"]
        return []

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
