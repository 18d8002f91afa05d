"""``launcher up --target slurm``: a simulated Slurm cluster in containers runs the generated batch script.

    python -m launcher up --target slurm --mesh 2x2x2 --model tiny --steps 3

From the same Launch: a controller container ``slurmctld`` and one ``slurmd`` container per node
(``node-0`` ..; hostname = NodeName), munge with one key made on the host, Debian's slurm-wlm
(image simcluster/slurm:latest, images/slurm/, built FROM the trainer image when missing), each node
with one GPU per rank as gres (``Gres=gpu:TYPE:N``, each a /dev/null device: a GPU job's ``#SBATCH
--gpus-per-node`` is granted as on a GPU cluster, and its ranks get the instruments' simulated GPUs). The
batch script of render.py is written to RUN_DIR/job.sbatch and submitted
unchanged as the image's user 1000 with ``sbatch --export=ALL,SIMCLUSTER_SETUP=true
--output=...`` (the image's /opt/venv is on PATH; the work folder /work holds this checkout's
train/ and launcher/, read-only, and the run folder). The job's output file is followed from the
host, its state polled with ``scontrol show job`` (``sbatch --wait`` polls with growing gaps),
then the summary; every container and the network are removed after success, failure or Ctrl-C.

Container settings (facts in /work/shared/notes/slurm-in-containers.md): root with Docker's
default capabilities (slurmd and munge need it: the one exception to the non-root,
capabilities-dropped containers), no cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none:
Slurm enforces no CPU or memory limit; Docker's own limits still apply to each node container).
"""
from __future__ import annotations

import os
import secrets
import time

from simcluster.launcher.docker.client import Client
from simcluster.launcher.docker.container import exec_in, remove
from simcluster.launcher.docker import images
from simcluster.launcher.engines.deps_image import with_image
from simcluster.launcher.engines.gpus import names_of
from simcluster.launcher.docker import cluster
from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.job.files import IMAGES, code_sources, host_abspath, make_run_dir
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import IMAGE as TRAINER_IMAGE, IMAGE_USER, LABEL
from simcluster.launcher.instrument.spec import BOOT_DIR, ENABLE
from simcluster.core.layout import node_of
from simcluster.launcher.observe.progress import split_rank
from simcluster.launcher.observe.summary import summarise
from simcluster.launcher.engines.base import UpOptions
from simcluster.launcher.engines.skeleton import open_stream
from simcluster.launcher.engines.slurm import render as slurm
from simcluster.core.hang import EXIT_HANG, read_hang

IMAGE = "simcluster/slurm:latest"
CONTROLLER = "slurmctld"
WORK = "/work"  # the job's work folder inside the simulation
SLURM_LABEL = LABEL + "slurm"  # on the simulation's containers and network: what the teardown finds


GPU_DEVICE = "/dev/simgpu"  # a slurmd node's simulated GPU k: /dev/null as the character device GPU_DEVICE<k>


def gres(launch: Launch) -> tuple[str, str, list[str]]:
    """(the node line's Gres= value, gres.conf, the node containers' devices): every node holds one simulated GPU
    per rank, of the gres type --gpu names (engines/gpus.py; an untyped --gpus-per-node=N takes any type), each a
    device file as slurmd requires (/dev/null as GPU_DEVICE0..N-1), so Slurm grants the request and sets
    CUDA_VISIBLE_DEVICES=0,..,N-1 as on a GPU node; the ranks' GPUs are the instruments' (launcher/instrument/gpu/)."""
    n, kind = launch.nproc_per_node, names_of(launch.instruments.gpu).slurm
    files = f"{GPU_DEVICE}[0-{n - 1}]" if n > 1 else f"{GPU_DEVICE}0"
    return (f"gpu:{kind}:{n}", f"AutoDetect=off\nName=gpu Type={kind} File={files}\n",
            [f"/dev/null:{GPU_DEVICE}{k}:rwm" for k in range(n)])


def slurm_conf(launch: Launch) -> str:
    """slurm.conf of the simulation: cgroup-free plugins, nodes idle on registration, each with its GPUs (gres)."""
    nodes = ",".join(launch.names)
    return "\n".join(["GresTypes=gpu",
        "ClusterName=simcluster", f"SlurmctldHost={CONTROLLER}", "AuthType=auth/munge", "CredType=cred/munge",
        "SlurmUser=root", "SlurmdUser=root", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
        "MailProg=/bin/true", "StateSaveLocation=/var/spool/slurmctld", "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.pid", "MinJobAge=600",
        f"NodeName={nodes} CPUs=2 RealMemory=1000 Gres={gres(launch)[0]} State=UNKNOWN",
        "PartitionName=sim Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


def ensure_image(base: str = TRAINER_IMAGE) -> str:
    """The Slurm image FROM base (images/slurm/), built when missing: IMAGE over the trainer image, or
    simcluster/slurm:<base's tag> over the derived image of --requirements (engines/deps_image.py)."""
    tag = IMAGE if base == TRAINER_IMAGE else f"{IMAGE.rsplit(':', 1)[0]}:{base.rsplit(':', 1)[-1]}"
    if images.image_created(tag) is None:
        print(f"launcher | building {tag} (images/slurm/Dockerfile FROM {base}, apt over http)", flush=True)
        images.build_image(os.path.join(IMAGES, "slurm"), tag, buildargs={"BASE_IMAGE": base})
    return tag


def submit_env(launch: Launch, job_run: str) -> dict[str, str]:
    """What the simulation's ``sbatch --export=ALL,...`` adds to the batch script's own environment
    (the script itself stays the one a real cluster gets): SIMCLUSTER_SETUP ``true`` (the image's
    venv is already on PATH) and, for your code, the instruments a Compose node's wrapper gives its
    ranks (launcher/container/node.py instrument_env): their boot folder first on PYTHONPATH (each
    rank's interpreter runs its sitecustomize; stock torchrun starts fresh ones), the work folder
    holding this checkout's ``simcluster`` last, SIMCLUSTER_INSTRUMENT=1, and SIMCLUSTER_OUTPUT_DIR,
    the run folder as the nodes see it; and torchrun's ``--tee 3`` (``PET_TEE``, torchrun's own
    environment form of a flag) with the ``[rankR]:`` prefix a Compose node sets, so that each line
    is shown as its rank's and a printed loss is read. The instruments' settings (simulated GPUs,
    stall watch, traffic) are the script's own exports (engines/document.py node_env). No value
    holds a comma."""
    env = {"SIMCLUSTER_SETUP": "true"}
    if launch.train is None:
        boot = f"{WORK}/simcluster/launcher/instrument/{BOOT_DIR}"
        env.update(PYTHONPATH=f"{boot}:{WORK}", **{ENABLE: "1"}, SIMCLUSTER_OUTPUT_DIR=job_run,
                   PET_TEE="3", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]:")
    return env


def _exec(container, cmd: list[str], user: str = "root", workdir: str | None = None) -> tuple[int, str]:
    return exec_in(container, cmd, user, workdir)


def _job_fields(text: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in text.split() if "=" in tok)


JOB_TIMEOUT_S = 900.0  # the batch job ends by then, or it is cancelled
UNSUPPORTED = {  # `up` options only the Compose engine implements, with what to do instead
    "build": "the simulation's Slurm image is built over the trainer image as it is (only when missing); rebuild "
             "the trainer image first with python -m launcher build --force, or use --target compose",
    "max_restarts": "Slurm restarts are the job's own (sbatch --requeue, torchrun --max-restarts with --resume "
                    "auto); use --target compose for whole-cluster restarts here",
    "start_late": "every node of an allocation starts together; use --target compose for late-join drills",
    "keep": "the simulation is always removed; the run folder keeps the job's output",
    "wall_timeout_s": "a Slurm job's wall-clock limit is its own (sbatch --time); use --target compose or swarm",
    "exit_grace_s": "Slurm ends a job's steps itself (its KillWait); use --target compose or swarm",
}


def up(launch: Launch, command: str, opts: UpOptions, timeout_s: float = JOB_TIMEOUT_S) -> int:
    """Bring the Slurm simulation up, submit, follow, summarise, tear down; returns the exit code.

    Raises:
        LauncherError: Docker failed, the nodes never went idle, sbatch failed, or the job outlived timeout_s.
    """
    return _up(launch, command, opts, timeout_s)


def _up(launch: Launch, command: str, opts: UpOptions, timeout_s: float) -> int:
    launch = with_image(launch)  # --requirements: the derived image, the Slurm image FROM it
    image = ensure_image(launch.node.image)
    run_dir = os.path.abspath(host_abspath(launch.run_dir))
    make_run_dir(run_dir, IMAGE_USER, launch.record())
    meta = os.path.join(run_dir, ".slurm")
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, "slurm.conf"), "w") as fh:
        fh.write(slurm_conf(launch))
    with open(os.path.join(meta, "gres.conf"), "w") as fh:
        fh.write(gres(launch)[1])
    with open(os.path.join(meta, "munge.key"), "wb") as fh:
        fh.write(secrets.token_bytes(1024))
    script = os.path.join(run_dir, "job.sbatch")
    with open(script, "w") as fh:
        fh.write(slurm.render(launch, command))
    # the run folder where the script names it: WORK/<run_dir> when relative, the same path when absolute
    job_run = launch.run_dir if os.path.isabs(launch.run_dir) else f"{WORK}/{launch.run_dir}"
    volumes = {os.path.join(meta, "slurm.conf"): {"bind": "/etc/slurm/slurm.conf", "mode": "ro"},
               os.path.join(meta, "gres.conf"): {"bind": "/etc/slurm/gres.conf", "mode": "ro"},
               os.path.join(meta, "munge.key"): {"bind": "/etc/simcluster/munge.key", "mode": "ro"},
               run_dir: {"bind": job_run, "mode": "rw"},
               **{host: {"bind": f"{WORK}/{name}", "mode": "ro"} for name, host in code_sources().items()}}
    for m in launch.mounts:
        if m.target.startswith("/data/"):
            volumes[host_abspath(m.source)] = {"bind": m.source if os.path.isabs(m.source) else f"{WORK}/{m.source}",
                                               "mode": "ro"}
    tag = f"sc-slurm-{launch.run_name}".lower()
    client = Client()  # the controller and the slurmd nodes: containers of this machine's daemon
    t0 = time.monotonic()
    cluster.create_network(client, tag, labels={SLURM_LABEL: tag})
    made = []
    try:
        limits = {}
        if launch.node.cpus_per_node:
            limits["nano_cpus"] = int(launch.node.cpus_per_node * 1e9)
        if launch.node.memory_per_node:
            limits["mem_limit"] = launch.node.memory_per_node
        for name, role in [(CONTROLLER, "slurmctld"), *[(n, "slurmd") for n in launch.names]]:
            made.append(client.run_container(image, [role], name=f"{tag}-{name}", hostname=name, network=tag,
                                             volumes=volumes, labels={SLURM_LABEL: tag},
                                             environment={"OMP_NUM_THREADS": "1"},
                                             **({**limits, "devices": gres(launch)[2]} if role == "slurmd" else {})))
        ctl = made[0]
        for c in made:  # the short names resolve on the network
            cluster.attach(client, tag, c, [c.attrs["Config"]["Hostname"] if c.attrs else c.name.rsplit("-", 1)[0]])
        stream = open_stream(launch, run_dir, opts)
        stream.per_rank = False  # one output file of the batch job, without rank prefixes
        return _run_job(ctl, launch, job_run, run_dir, t0, timeout_s, stream)
    finally:
        for c in made:
            try:
                remove(c)
            except LauncherError:  # best effort teardown, go on with the rest
                pass
        cluster.remove_network(client, tag)


def _run_job(ctl, launch: Launch, job_run: str, run_dir: str, t0: float, timeout_s: float, stream) -> int:
    """Wait for idle nodes, sbatch, follow the job's output file into the stream, summarise."""
    deadline = time.monotonic() + 60
    while True:
        rc, out = _exec(ctl, ["sinfo", "-h", "-o", "%T %D"])
        idle = sum(int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == ["idle"]) if rc == 0 else 0
        if idle >= launch.nnodes:
            break
        if time.monotonic() > deadline:
            raise LauncherError(f"Slurm nodes not idle after 60 s (sinfo: {out.strip()!r})")
        time.sleep(0.5)
    stream.show(f"launcher | slurm: {launch.nnodes} nodes idle after {time.monotonic() - t0:.1f}s; sbatch job.sbatch")
    export = ",".join(["ALL", *(f"{k}={v}" for k, v in submit_env(launch, job_run).items())])
    rc, out = _exec(ctl, ["sbatch", "--parsable", f"--export={export}",
                          f"--output={job_run}/%x-%j.out", f"{job_run}/job.sbatch"], user=IMAGE_USER, workdir=WORK)
    if rc != 0:
        raise LauncherError(f"sbatch failed: {out.strip()}")
    job = out.strip().split(";")[0]
    log = os.path.join(run_dir, f"{launch.job_name}-{job}.out")
    pos, fields, running = 0, {}, None
    end = time.monotonic() + timeout_s
    while True:
        if os.path.exists(log):
            with open(log, errors="replace") as fh:
                fh.seek(pos)
                for line in fh.read().splitlines(keepends=True):
                    if not line.endswith("\n"):
                        break
                    pos += len(line.encode())
                    _show(stream, launch, line.rstrip("\n"))
        _, out = _exec(ctl, ["scontrol", "show", "job", job])
        fields = _job_fields(out)
        if running is None and fields.get("JobState") == "RUNNING":
            running = time.monotonic() - t0
            stream.show(f"launcher | slurm job {job} RUNNING after {running:.1f}s")
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        if time.monotonic() > end:
            _exec(ctl, ["scancel", job])
            raise LauncherError(f"slurm job {job} still {fields.get('JobState')} after {timeout_s:.0f}s; cancelled")
        time.sleep(0.5)
    if os.path.exists(log):
        with open(log, errors="replace") as fh:
            fh.seek(pos)
            for line in fh.read().splitlines():
                _show(stream, launch, line)
    state, code = fields.get("JobState"), fields.get("ExitCode", "?")
    stream.show(f"launcher | slurm job {job} {state} (exit {code}) on {launch.nnodes} nodes; output {log}")
    exit_code = 0 if state == "COMPLETED" else int(code.split(":")[0]) if code.split(":")[0].isdigit() else 1
    codes = {name: exit_code for name in launch.names}  # the job's exit code: Slurm keeps no per-node one
    wall = time.monotonic() - t0
    if summarise(stream, launch, run_dir, codes, wall, time.time() - wall) and state == "COMPLETED":
        return 0
    return EXIT_HANG if read_hang(run_dir, time.time() - wall) else 1


def _show(stream, launch: Launch, line: str) -> None:
    """One line of the job's output: a rank's line (``[rankR]:``) is shown as the node that holds
    rank R (layout.node_of), as Compose shows it; other lines as the batch script's."""
    rank, _ = split_rank(line)
    stream.handle(launch.names[node_of(rank, launch.nproc_per_node)] if rank is not None else "slurm", line)
