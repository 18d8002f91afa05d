"""Slurm target: a Launch -> the batch script a user submits with ``sbatch`` on a real cluster.

    python -m launcher generate --mesh 2x2x2 --model tiny --target slurm   # slurm/mesh-2x2x2.sbatch
    sbatch slurm/mesh-2x2x2.sbatch              # on the cluster, from the project checkout

``#SBATCH --nodes=NNODES --ntasks-per-node=1``: one ``srun`` task per node starts stock
torchrun with ``--node-rank $SLURM_NODEID`` (node k of the allocation holds ranks k*nproc ..
(k+1)*nproc-1, pipeline stage k) and ``--master-addr`` the allocation's first host (static
rendezvous). CPUs, memory and GPUs per node map to ``--cpus-per-task``, ``--mem`` and
``--gpus-per-node`` (a GPU job, engines/gpus.py: one per rank, ``TYPE:N`` with --gpu; nothing hides
them: only a CPU job exports ``CUDA_VISIBLE_DEVICES=''``). Nothing of the simulation is baked in: the work folder (the project
checkout on shared storage; default the submit folder), the environment (a shell line; default
``source .venv/bin/activate``, e.g. ``module load pytorch``; ``true`` with pyxis) and the image pyxis
runs (``srun --container-image``: --image with --pyxis, the image rehearsed here) are options of ``generate`` and can be overridden at submit time by
SIMCLUSTER_WORKDIR / SIMCLUSTER_SETUP in the environment (``sbatch --export=ALL,...``). The
run folder and data path are the ones given to ``generate``, relative to the work folder. A hang
leaves each rank's Flight Recorder dump in RUN_DIR/flight-recorder (train/flightrec.py dump_env;
read them with ``python -m launcher diagnose RUN_DIR``).
"""
from __future__ import annotations

import math
import re
import shlex

from simcluster.launcher.job.launch import Launch
from simcluster.launcher.engines.document import HEADER, MASTER_PORT, host_argv, node_env, torchrun_argv
from simcluster.launcher.engines.gpus import gpus_per_node, model
from simcluster.core.flightrec import DUMP_DIR, dump_env

DEFAULT_SETUP = "source .venv/bin/activate"
PYXIS_SETUP = "true"  # with pyxis the image holds torch and torchrun: nothing to set up on the host


def container_image(launch: Launch) -> str | None:
    """The image pyxis runs torchrun in: --container-image, or --image with --pyxis; None: the venv line."""
    eng = launch.engine
    return eng.container_image or (launch.node.image if eng.pyxis else None)


def same_image(a: str, b: str) -> bool:
    """True when two references name one image; enroot's ``registry#repo`` form equals ``registry/repo``."""
    return a.replace("#", "/", 1) == b.replace("#", "/", 1)


def gpus_option(launch: Launch) -> str | None:
    """``--gpus-per-node=N`` (one GPU per rank), ``=TYPE:N`` with --gpu (the gres type, engines/gpus.py); None: CPUs."""
    n = gpus_per_node(launch)
    if not n:
        return None
    names = model(launch)
    return f"--gpus-per-node={names.slurm}:{n}" if names else f"--gpus-per-node={n}"


def slurm_mem(memory: str) -> str:
    """A compose-style size (``3g``, ``1536m``, ``2.5g``) as sbatch's --mem (whole megabytes: ``3072M``)."""
    m = re.fullmatch(r"([0-9.]+)([bkmg]?)", str(memory).lower())
    scale = {"b": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "": 1 / 2**20}[m.group(2)]
    return f"{max(1, math.ceil(float(m.group(1)) * scale))}M"


def sbatch_options(launch: Launch) -> list[str]:
    """The ``#SBATCH`` lines: nodes, one task per node, resources, output file."""
    node, eng = launch.node, launch.engine
    opts = [f"--job-name={launch.job_name}", f"--nodes={launch.nnodes}", "--ntasks-per-node=1"]
    if node.cpus_per_node is not None:
        opts.append(f"--cpus-per-task={max(1, math.floor(node.cpus_per_node))}")
    if node.memory_per_node is not None:
        opts.append(f"--mem={slurm_mem(node.memory_per_node)}")
    if gpus_option(launch):
        opts.append(gpus_option(launch))
    if eng.workdir:
        opts.append(f"--chdir={eng.workdir}")
    opts.append("--output=%x-%j.out")
    return [f"#SBATCH {o}" for o in opts]


WORKDIR_MARK = "$SIMCLUSTER_WORKDIR/"  # a path under the work folder, written unquoted for the shell to expand


def shell_value(value: str) -> str:
    """value quoted for bash; a leading WORKDIR_MARK stays the work folder's variable: the ranks get an
    absolute path whatever folder your code changes into (an absolute run folder is taken as is)."""
    if value.startswith(WORKDIR_MARK):
        rest = value[len(WORKDIR_MARK):]
        return shlex.quote(rest) if rest.startswith("/") else '"$SIMCLUSTER_WORKDIR"/' + shlex.quote(rest)
    return shlex.quote(value)


def render(launch: Launch, command: str, file: str | None = None, project_dir: str | None = None) -> str:
    """The batch script's text (deterministic)."""
    q = shlex.quote
    eng = launch.engine
    image = container_image(launch)
    setup = eng.setup if eng.setup is not None else PYXIS_SETUP if image else DEFAULT_SETUP
    env = {**dump_env(WORKDIR_MARK + launch.run_dir), **node_env(launch), "MASTER_PORT": str(MASTER_PORT)}  # --env wins
    if gpus_per_node(launch) == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job (--no-simulated-gpus, --device cpu): no rank grabs a node's GPU
    torchrun = torchrun_argv(launch, '"$SLURM_NODEID"', '"$MASTER_ADDR"', host_argv(launch))
    node_cmd = " ".join(a if a.startswith('"$') else q(a) for a in torchrun)
    inner = f"export SIMCLUSTER_NODE=$SLURM_NODEID; exec {node_cmd}"
    srun = ["srun", f"--nodes={launch.nnodes}", f"--ntasks={launch.nnodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1"]
    if image:
        srun += [q(f"--container-image={image}"), '--container-mounts="$SIMCLUSTER_WORKDIR"',
                 '--container-workdir="$SIMCLUSTER_WORKDIR"']
    lines = [
        "#!/bin/bash",
        *sbatch_options(launch),
        HEADER.format(module="slurm/render", command=command).rstrip("\n"),
        f"# Submit (from the folder holding this project's checkout, on shared storage): sbatch {launch.job_name}.sbatch",
        "# Override at submit time: sbatch --export=ALL,SIMCLUSTER_WORKDIR=DIR,SIMCLUSTER_SETUP='module load x' FILE",
        "set -euo pipefail",
        f"SIMCLUSTER_WORKDIR=${{SIMCLUSTER_WORKDIR:-{q(eng.workdir) if eng.workdir else '$SLURM_SUBMIT_DIR'}}}",
        f"SIMCLUSTER_SETUP=${{SIMCLUSTER_SETUP:-{q(setup)}}}",
        'cd "$SIMCLUSTER_WORKDIR"',
        'eval "$SIMCLUSTER_SETUP"',
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)  # node 0: the rendezvous',
        *[f"export {k}={shell_value(v)}" for k, v in env.items()],
        "export MASTER_ADDR SIMCLUSTER_WORKDIR",
        f"mkdir -p {q(launch.run_dir)}/{DUMP_DIR}  # the run folder; torch writes a hang's Flight Recorder dumps there",
        'echo "[simcluster] slurm job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST), '
        'master $MASTER_ADDR"',
        f"{' '.join(srun)} \\",
        f"  bash -c {q(inner)}",
    ]
    return "\n".join(lines) + "\n"
