"""Every option of `up`, `generate` and `compare`, declared once: one field of one section, its spec
(default, range, example, help) the field's metadata, as torchtitan's JobConfig carries a docstring
under each field.

    python -c "from simcluster.launcher.job.sections import NodeOptions, spec; print(spec(NodeOptions, 'join_timeout_s'))"

The sections: the trainer's Config (simcluster/core/config.py, each field unset here: ``TrainerOptions``), the
job (``JobOptions``: what runs), the node options (``NodeOptions``: every node's container), the
engine options (``EngineOptions``: --target and the real engines' documents), the run options
(``UpOptions``: `up` only), ``GenerateOptions`` and ``CompareOptions`` (layout B and the metric).
job/request.py's JobRequest is the sections joined; launcher/parser.py makes each flag from its
field (``--join-timeout-s S``, its help, its default); the request types and checks every value
with the spec (job/fields.py); a Launch carries NodeOptions and EngineOptions, an engine's `up`
UpOptions. To add an option: one field here, plus the code that uses it (docs/options.md).

A field's kind comes from its annotation: ``int | None``, ``float | None``, ``str | None``, ``bool``
(a switch), ``tuple[str, ...]`` (a repeatable flag), ``tuple[tuple[str, float], ...]`` (NODE=S pairs).
Pure: no engine, no Docker SDK, no argparse.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from simcluster.launcher.container.layout import IMAGE, IMAGE_USER, JOIN_TIMEOUT_S
from simcluster.launcher.job.checks import MIN_CPUS
from simcluster.core.config import Config
from simcluster.core.hardware import GPU_NAMES

MAX_INT = 2**63 - 1  # every int field's bound unless its own is smaller (the trainer's seed is < 2**63)
MAX_STEPS = 10**7  # steps, total_steps and a traced step: far beyond any simulated run
MAX_NODES = 64  # nodes (containers) of one simulated cluster
MAX_RANKS = 64  # ranks per node
MAX_RESTARTS = 100
MAX_WAIT_S = 86400  # a node's join: a day (the rendezvous' timer, Compose's healthcheck times)
TIMER_LIMIT_S = 1e6  # the launcher's and the trainer's timers: about 11 days (simcluster/core/preflight_values.py)
RDZV_BACKENDS = ("c10d", "static")
KINDS = {"int | None": "int", "int": "int", "float | None": "float", "float": "float", "str | None": "str",
         "str": "str", "bool | None": "bool", "bool": "bool", "tuple[str, ...]": "strs", "tuple[tuple[str, float], ...]": "pairs"}


@dataclass(frozen=True)
class Spec:
    """One option: kind (int, float, str, bool, strs: a list of text, pairs: NODE -> seconds), its
    default, an example value, the inclusive range lo..hi of a number (strict_lo: lo itself refused),
    the choices of a text, the unit after a bound, its help, metavar and section (the parser's group);
    door: the table at the door its value names (``engines``: --target), checked there, not here;
    flag: its name on the command line."""

    kind: str
    default: object = None
    example: object = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    strict_lo: bool = False
    unit: str = ""
    help: str = ""
    metavar: str | None = None
    section: str = ""
    door: str = ""
    flag: str = ""  # on the command line: --name-with-dashes


def option(default=None, example=None, help: str = "", **spec):
    """A section's field: its default, a valid example, its help, and Spec's other keywords."""
    return field(default=default, metadata={"spec": dict(example=example, help=help, **spec)})


def specs(section) -> dict[str, Spec]:
    """name -> Spec of every field of a section (a class or an instance), in its order."""
    return {f.name: Spec(KINDS[str(f.type)], f.default, section=section.title, flag="--" + f.name.replace("_", "-"),
                         **f.metadata["spec"])
            for f in dataclasses.fields(section) if "spec" in f.metadata}


def spec(section, name: str) -> Spec:
    """One field's Spec."""
    return specs(section)[name]


@dataclass(frozen=True)
class JobOptions:
    """What runs: the built-in trainer (default), your script or module; its shape, mounts, dependencies."""

    title: ClassVar[str] = "your own code (arguments after -- go to it)"
    script: str | None = option(None, "examples/ddp.py", metavar="FILE", help="run this torchrun script on every "
                                "rank (its folder is mounted read-only at /code)")
    module: str | None = option(None, "mypkg.train", help="run python -m MODULE on every rank (default: the "
                                "built-in trainer); from --code DIR, else from the image")
    code: str | None = option(None, "examples", metavar="DIR", help="folder of your code, mounted read-only at "
                              "/code: the working directory, first on sys.path")
    nodes: int | None = option(None, 2, lo=1, hi=MAX_NODES, metavar="N", help="nodes, for jobs that are not 3D "
                               "(with --nproc-per-node, instead of --mesh)")
    nproc_per_node: int | None = option(None, 2, lo=1, hi=MAX_RANKS, metavar="M", help="ranks per node (with --nodes)")
    mount: tuple[str, ...] = option((), "/tmp/data:/data:ro", metavar="SRC:DST[:ro|rw]", help="bind-mount a host "
                                    "path into every node (read-only unless :rw; repeatable)")
    total_steps: int | None = option(None, 5, lo=1, hi=MAX_STEPS, metavar="N", help="your code's step count, for "
                                     "progress and ETA (else what it logs with simcluster.log)")
    no_cpu_bridges: bool = option(False, True, help="leave torch's CPU-only DTensor gaps unbridged in your ranks "
                                  "(see docs/own-code.md)")
    no_simulated_gpus: bool = option(False, True, help="no simulated GPU in your ranks: torch.cuda answers as torch's "
                                     "CPU build (default: each rank one GPU of its node, cuda -> cpu, nccl -> gloo; "
                                     "docs/own-code.md)")
    gpu: str | None = option(None, "h100-sxm", choices=GPU_NAMES, metavar="MODEL", help="the simulated GPU's model: "
                             "h100-sxm (default), a100-80g, or a planner hardware name")
    gpu_memory: str | None = option(None, "24GiB", metavar="SIZE", help="the simulated GPU's memory, to rehearse a "
                                    "smaller device: at most the --gpu model's, e.g. 24GiB, 512MiB or 40GB (10^9 "
                                    "bytes); allocations beyond it raise torch.cuda.OutOfMemoryError (default: the "
                                    "model's)")
    check_devices: bool = option(False, True, help="refuse what a GPU refuses at a per-op cost: an op mixing a cuda "
                                 "and a CPU tensor (CUDA's 'Expected all tensors to be on the same device'), an nccl "
                                 "collective on a CPU tensor (docs/own-code.md; default off: it slows small ops "
                                 "several times, BENCHMARKS.md)")
    requirements: str | None = option(None, "requirements.txt", metavar="FILE", help="your code's dependencies: "
                                      "wheels downloaded here for the image's Python (torch stays the image's), a "
                                      "derived image built FROM it once per content (docs/own-code.md)")
    wheel: tuple[str, ...] = option((), "dist/mypkg-0.1-py3-none-any.whl", metavar="PATH", help="a wheel you "
                                    "built, installed into that image too (repeatable)")
    env: tuple[str, ...] = option((), "WANDB_MODE=offline", metavar="KEY=VALUE", help="a variable for every rank "
                                  "(repeatable), e.g. --env WANDB_MODE=offline; the cluster's own (RANK, MASTER_ADDR, "
                                  "SIMCLUSTER_*, ...) are refused (launcher/job/env.py)")


@dataclass(frozen=True)
class NodeOptions:
    """Container-level options, the same for every node (a Launch's ``node``)."""

    title: ClassVar[str] = "node options"
    cpus_per_node: float | None = option(None, 1.0, lo=MIN_CPUS, unit=" CPUs", metavar="CPUS", help="CPU limit "
                                         "per node container (compose cpus; default: none)")
    memory_per_node: str | None = option(None, "3g", metavar="SIZE", help="memory limit per node container, e.g. "
                                         "3g (compose mem_limit; default: none); the built-in trainer's predicted "
                                         "tensors per node are checked against it (a warning)")
    strict_memory: bool = option(False, True, help="refuse (exit 2) instead of warning when a node's predicted "
                                 "memory exceeds --memory-per-node")
    image: str = option(IMAGE, IMAGE, help="image of every container; needs Python, torch and this project's "
                        "launcher package (built locally by images/build.sh; services carry pull_policy: never)")
    rdzv_backend: str = option("c10d", "c10d", choices=RDZV_BACKENDS, metavar="NAME", help="torchrun rendezvous "
                               "backend (see launcher/container/node.py)")
    mount_code: bool = option(False, True, help="bind-mount this checkout's train/ and launcher/ over /app (no "
                              "image rebuild)")
    join_timeout_s: float = option(JOIN_TIMEOUT_S, 120.0, lo=0, hi=MAX_WAIT_S, strict_lo=True, unit=" s", metavar="S", help="every node "
                                   "must join the rendezvous within S seconds of its start, else the job ends "
                                   "naming the missing node")
    torchrun: bool = option(False, True, help="start the ranks with stock torchrun, a fresh interpreter each "
                            "(default: torchrun's agent forking them after one import of torch per node, ~10 s "
                            "faster on 2 cores)")
    inter_node_bandwidth: str | None = option(None, "100mbit", metavar="RATE", help="limit each node's network to "
                                              "RATE in tc's units (100mbit, 1gbit) with tc tbf, applied by a root "
                                              "helper container before the ranks start (default: unshaped)")
    inter_node_latency: str | None = option(None, "10ms", metavar="DELAY", help="refused on this machine: its "
                                            "kernel has no netem, the qdisc that adds delay")
    user: str | None = option(None, "1000:1000", metavar="UID:GID", help="user the containers run as (generate: "
                              f"{IMAGE_USER}, the image's; up: yours, or {IMAGE_USER} when run as root)")

    def __post_init__(self):
        if self.user is None:  # a Launch's nodes run as someone: the image's user unless told
            object.__setattr__(self, "user", IMAGE_USER)


@dataclass(frozen=True)
class EngineOptions:
    """--target and the options of the real engines' documents (a Launch's ``engine``)."""

    title: ClassVar[str] = "engines (launcher/engines/)"
    target: str = option("compose", "compose", door="engines", metavar="ENGINE", help="the engine: {engines} "
                         "(swarm: a Docker Swarm stack); up runs {runs_here} here (swarm: a one-node swarm when "
                         "there is none)")
    workdir: str | None = option(None, "/shared/simcluster", metavar="DIR", help="slurm: work folder of the job, "
                                 "this project's checkout on shared storage (default: the folder sbatch runs in); "
                                 "swarm: absolute folder relative bind-mount sources are taken from (default: "
                                 "relative to the stack file)")
    setup: str | None = option(None, "module load pytorch", metavar="SHELL", help="slurm: shell line that gives a "
                               "node torchrun and torch (default: source .venv/bin/activate; e.g. 'module load "
                               "pytorch')); skypilot: the task's setup runs it first")
    container_image: str | None = option(None, "nvcr.io/nvidia/pytorch:24.05-py3", metavar="IMAGE", help="slurm: "
                                         "run torchrun in this registry image through pyxis (srun "
                                         "--container-image); with --image both must name one image (or use --pyxis)")
    runs_claim: str = option("simcluster-runs", "simcluster-runs", metavar="PVC", help="jobset/trainjob: "
                             "PersistentVolumeClaim mounted at /runs, data under its data/ folder")
    hosts: int | None = option(None, 2, lo=1, hi=MAX_NODES, metavar="N", help="swarm: rehearse N hosts here "
                               "(host-0 .. host-N-1, each a Docker engine in a container, one swarm, a registry "
                               "on host-0, the run folder shared); node k runs on host k mod N")
    inter_host_bandwidth: str | None = option(None, "100mbit", metavar="RATE", help="swarm --hosts: limit each "
                                              "host's link to the others to RATE with tc tbf (e.g. 100mbit); "
                                              "nodes on one host are untouched")
    # the image rehearsed is the image that runs (launcher/engines/push.py, slurm/render.py)
    pyxis: bool = option(False, True, help="slurm: the cluster has pyxis: srun runs torchrun in --image (the image "
                         "rehearsed here, or the one --push names) with --container-image, and the venv line goes")
    push: str | None = option(None, "registry.example.com:5000", metavar="REGISTRY", help="generate: tag the image "
                              "(--requirements' derived one too) as REGISTRY/NAME:TAG, push it there and name it so in "
                              "the job (the registry must answer first); jobset, trainjob, skypilot, swarm, slurm --pyxis")


@dataclass(frozen=True)
class UpOptions:
    """What `up` adds to a Launch (the engine's ``up`` takes it)."""

    title: ClassVar[str] = "run options (up)"
    build: bool = option(False, True, help="run images/build.sh even if the image exists")
    keep: bool = option(False, True, help="leave the stopped containers (no `down` at the end)")
    quiet: bool = option(False, True, help="hide per-step lines; show progress lines instead")
    progress_every: float = option(10.0, 10.0, lo=0, hi=86400, strict_lo=True, metavar="S",
                                   help="seconds between progress lines")
    max_restarts: int = option(0, 1, lo=0, hi=MAX_RESTARTS, metavar="N", help="after a failure restart the "
                               "whole cluster up to N times, resuming from the run's newest checkpoint (use with "
                               "--ckpt-every)")
    start_late: tuple[tuple[str, float], ...] = option((), {"node-1": 20}, metavar="NODE=S", help="start NODE's "
                                                       "container S seconds after the others (late-join drill; "
                                                       "repeatable)")
    wall_timeout_s: float | None = option(None, 600.0, lo=0, hi=TIMER_LIMIT_S, strict_lo=True, unit=" s", metavar="S", help="kill the whole run, restarts included, "
                                          "after S seconds; it fails as timed out (default: no limit; "
                                          "--timeout-s is the job's own, ending a run whose peers went silent)")
    metric_regex: str | None = option(None, r"^step (?P<step>\d+) loss (?P<value>\S+)", metavar="REGEX",
                                      help="how the summary reads a loss your ranks only print: one group (the "
                                      "value; n-th match = step n) or named groups step and value (default: the "
                                      "common formats, 'loss: 1.2', 'loss=1.2', 'step 3 | loss 1.2', torchtitan's "
                                      "'step: 3  loss: 1.2')")
    exit_grace_s: float = option(10.0, 30.0, lo=0, hi=3600, strict_lo=True, metavar="S", help="once the "
                                 "rendezvous has ended, seconds a node still up gets to exit by itself (a rank "
                                 "writing its last checkpoint or records) before it is killed; likewise the "
                                 "rendezvous after every node exited")

    def deadline(self, t0: float) -> tuple[float, float] | None:
        """(the time.monotonic() by which `up`, started at t0, must end, wall_timeout_s), or None."""
        return None if self.wall_timeout_s is None else (t0 + self.wall_timeout_s, self.wall_timeout_s)


@dataclass(frozen=True)
class GenerateOptions:
    """Where `generate` writes."""

    title: ClassVar[str] = "output (generate)"
    out: str | None = option(None, "compose/mesh-2x2x2.yml", help="output file (default, in the repo: "
                             "compose/mesh-PPxDPxTP.yml; swarm/mesh-PPxDPxTP.yml; slurm/mesh-PPxDPxTP.sbatch; "
                             "k8s/mesh-PPxDPxTP-jobset.yaml, k8s/mesh-PPxDPxTP-trainjob.yaml; skypilot/mesh-PPxDPxTP.yaml)")
    stdout: bool = option(False, True, help="print the YAML that would go to --out; write nothing")


@dataclass(frozen=True)
class CompareOptions:
    """`compare`: layout B (as the job's mesh or nodes x ranks is A's) and the metric compared; checked by
    launcher/compare_read.py (their own messages), typed on the command line by argparse."""

    title: ClassVar[str] = "layout B and the comparison"
    against: str | None = option(None, "2x2x1", metavar="PPxDPxTP", help="layout B, a 3D mesh (may equal A: "
                                 "determinism)")
    against_nodes: int | None = option(None, 1, metavar="N", help="layout B: N nodes (with "
                                       "--against-nproc-per-node; 1 and 1: one process)")
    against_nproc_per_node: int | None = option(None, 1, metavar="M", help="layout B: M ranks per node")
    metric: str | None = option(None, "loss", help="key of your metrics.jsonl rows to compare (default loss; not "
                                "with --metric-regex)")
    metric_regex: str | None = option(None, r"loss (\S+)", metavar="REGEX", help="read the metric from what the "
                                      "ranks print instead: one group (the value; n-th match = step n) or named "
                                      "groups step and value")
    rtol: float = option(1e-5, 1e-5, metavar="R", help="largest |A - B| / |B| allowed")


COMPARE_TRAINER = ("mesh", "run_dir", "timeout_s", "traffic", "trace_steps")  # the trainer's flags compare takes
COMPARE_RUN = ("quiet",)  # and the run options (sweep too)
FULL_SIZE_JOB = ("script", "module", "code", "nodes", "nproc_per_node", "gpu", "requirements", "env")  # plan --full-size
SWEEP_COMPARE = ("metric", "metric_regex", "rtol")  # CompareOptions' fields sweep takes (its layouts are its own)


_CONFIG_EXAMPLES = {"mesh": "2x2x2", "model": "tiny", "dim": 64, "n_layers": 4, "n_heads": 4, "ffn_dim": 128,
                    "seq_len": 64, "global_batch": 8, "data": "data/corpus.txt", "run_dir": "runs/mesh-2x2x2",
                    "resume": "runs/mesh-2x2x2", "trace_steps": "2,3", "steps": 3, "stall_s": 60}
_CONFIG_SPECS = {"steps": dict(lo=1, hi=MAX_STEPS), "timeout_s": dict(lo=0, hi=TIMER_LIMIT_S, strict_lo=True, unit=" s")}


def _trainer_options():
    """The trainer's Config as a section: ``config`` (its YAML file) and each Config field, unset (None);
    their help is Config's docstrings (simcluster/core/flags.py add_config_args makes their flags)."""
    out = [("config", "str | None", option(None, "run.yaml", metavar="YAML"))]
    for f in dataclasses.fields(Config):
        kind = f.type.split("|")[0].strip()
        extra = _CONFIG_SPECS.get(f.name, {})
        out.append((f.name, f"{kind} | None", option(None, _CONFIG_EXAMPLES.get(f.name, f.default), **extra)))
    return dataclasses.make_dataclass("TrainerOptions", out, frozen=True, namespace={
        "title": "the trainer's options (simcluster/core/config.py Config)",
        "__doc__": "The built-in trainer's Config fields, each unset (None): the YAML file's or Config's default."})


TrainerOptions = _trainer_options()
