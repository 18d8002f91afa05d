"""The Kubernetes engines' one base: a Launch -> one manifest (JobSet, TrainJob), rendered here, run with kubectl.

    python -m launcher generate --mesh 2x2x2 --model tiny --target jobset --image example.com/trainer:1 --stdout

``Kubernetes`` is a RenderOnly engine (``up``, ``status``, ``logs``, ``down`` refused here) whose
document is its ``build(launch)`` dict under the generated-file header naming ``module``; the pods
pull --image on the cluster's nodes, so it must name a registry. ``pod_env`` is the environment
both put in the node container: the shared one (document.py node_env), the Flight Recorder's dump on
timeout into the run folder (train/flightrec.py; the command makes its folder: document.py
with_dump_folder) and the engine's own, with gloo on eth0 when the job runs on CPUs.
"""
from __future__ import annotations

from simcluster.launcher.engines.base import RenderOnly
from simcluster.launcher.engines.document import HEADER, dump, node_env
from simcluster.launcher.engines.gpus import gpu_job
from simcluster.launcher.job.launch import Launch
from simcluster.core.flightrec import dump_env


def pod_env(launch: Launch, **extra: str) -> dict[str, str]:
    """The node container's environment: the Flight Recorder's dump on timeout into the run folder
    (simcluster/core/flightrec.py dump_env), document.py node_env (no instruments: the pods run stock torchrun;
    your --env last: it may change those), the engine's extra, then GLOO_SOCKET_IFNAME=eth0 for a CPU job (a
    pod's one interface; a GPU job's nccl finds its own)."""
    env = {**dump_env(launch.output_dir), **node_env(launch, instruments=False), **extra}  # your --env TORCH_NCCL_...=... wins
    if not gpu_job(launch):
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    return env


class Kubernetes(RenderOnly):
    """A Kubernetes engine: ``build`` gives the manifest (a dict in fixed key order), ``module`` names the file
    that builds it in the header (launcher/engines/MODULE.py)."""

    module = ""
    reads = frozenset({"runs_claim"})
    requires = ""  # a header line naming what the cluster needs (a release), or nothing

    @staticmethod
    def build(launch: Launch) -> dict:
        """The manifest of launch (each engine's own)."""
        raise NotImplementedError

    def registry_image(self, launch: Launch, local: bool) -> tuple[str, str] | None:
        """--image: the pods pull it on the cluster's nodes."""
        return None if local else ("--image", launch.node.image)

    def render(self, launch: Launch, command: str, out_path: str, project_dir: str) -> str:
        """The manifest's text under a header naming command (out_path, project_dir: unused, no bind mounts)."""
        return HEADER.format(module=self.module, command=command) + self.requires + dump(self.build(launch))
