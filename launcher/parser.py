"""The launcher's flags as one argparse tree: every command's subparser (cli.py dispatches on it).

    python -c "from simcluster.launcher.parser import build_parser; build_parser().parse_args(['up', '--help'])"

Only the command line builds or calls it (cli.py): the Python API takes keywords (job/request.py).
The job request's options stay text here and are typed by the request, so both refuse a bad value
with one message. The trainer's own flags are train/cli.py's.
"""
from __future__ import annotations

import argparse
import os
import sys

from simcluster.launcher.container.layout import JOIN_TIMEOUT_S
from simcluster.launcher.job.fields import FIELDS
from simcluster.launcher.job.launch import RDZV_BACKENDS, EngineOptions, NodeOptions
from simcluster.train.cli import add_config_args
from simcluster.train.layout import TRAINER_MODULE


def add_job_args(parser: argparse.ArgumentParser) -> None:
    """What runs: the built-in trainer (default), a script or a module; its shape and mounts."""
    g = parser.add_argument_group("your own code (arguments after -- go to it)")
    g.add_argument("--script", default=None, metavar="FILE",
                   help="run this torchrun script on every rank (its folder is mounted read-only at /code)")
    g.add_argument("--module", default=None,
                   help=f"run python -m MODULE on every rank (default: {TRAINER_MODULE}, the built-in trainer); "
                        "from --code DIR, else from the image")
    g.add_argument("--code", default=None, metavar="DIR",
                   help="folder of your code, mounted read-only at /code: the working directory, first on sys.path")
    g.add_argument("--nodes", type=int, default=None, metavar="N", help="nodes, for jobs that are not 3D (with "
                   "--nproc-per-node, instead of --mesh)")
    g.add_argument("--nproc-per-node", type=int, default=None, metavar="M", help="ranks per node (with --nodes)")
    g.add_argument("--mount", action="append", default=[], metavar="SRC:DST[:ro|rw]",
                   help="bind-mount a host path into every node (read-only unless :rw; repeatable)")
    g.add_argument("--total-steps", type=int, default=None, metavar="N",
                   help="your code's step count, for progress and ETA (else what it logs with simcluster.log)")
    g.add_argument("--no-cpu-bridges", action="store_true",
                   help="leave torch's CPU-only DTensor gaps unbridged in your ranks (see docs/own-code.md)")
    g.add_argument("--no-simulated-gpus", action="store_true",
                   help="no simulated GPU in your ranks: torch.cuda answers as torch's CPU build (default: each rank "
                        "one GPU of its node, cuda -> cpu, nccl -> gloo; docs/own-code.md)")
    g.add_argument("--gpu", default=None, metavar="MODEL",
                   help="the simulated GPU's model: h100-sxm (default), a100-80g, or a planner hardware name")
    g.add_argument("--requirements", default=None, metavar="FILE",
                   help="your code's dependencies: wheels downloaded here for the image's Python (torch stays the "
                        "image's), a derived image built FROM it once per content (docs/own-code.md)")
    g.add_argument("--wheel", action="append", default=[], metavar="PATH",
                   help="a wheel you built, installed into that image too (repeatable)")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="a variable for every rank (repeatable), e.g. --env WANDB_MODE=offline; the cluster's own "
                        "(RANK, MASTER_ADDR, SIMCLUSTER_*, ...) are refused")


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """Container options of every node (see launcher/job/launch.py NodeOptions)."""
    g = parser.add_argument_group("node options")
    g.add_argument("--cpus-per-node", type=float, default=None, help="CPU limit per node container (default: none)")
    g.add_argument("--memory-per-node", default=None, help="memory limit per node container, e.g. 3g (default: none); "
                   "the built-in trainer's predicted tensors per node are checked against it (a warning)")
    g.add_argument("--strict-memory", action="store_true",
                   help="refuse (exit 2) instead of warning when a node's predicted memory exceeds --memory-per-node")
    g.add_argument("--image", default=NodeOptions.image,
                   help=f"image of every container (default {NodeOptions.image}); needs Python, torch and this "
                        f"project's launcher package")
    g.add_argument("--rdzv-backend", choices=RDZV_BACKENDS, default=NodeOptions.rdzv_backend,
                   help="torchrun rendezvous backend (default c10d; see launcher/container/node.py)")
    g.add_argument("--mount-code", action="store_true",
                   help="bind-mount this checkout's train/ and launcher/ over /app (no image rebuild)")
    g.add_argument("--join-timeout-s", type=float, default=JOIN_TIMEOUT_S, metavar="S",
                   help=f"every node must join the rendezvous within S seconds of its start, else the job "
                        f"ends naming the missing node (default {JOIN_TIMEOUT_S:g})")
    g.add_argument("--torchrun", action="store_true",
                   help="start the ranks with stock torchrun, a fresh interpreter each (default: torchrun's "
                        "agent forking them after one import of torch per node, ~10 s faster on 2 cores)")
    g.add_argument("--inter-node-bandwidth", default=None, metavar="RATE",
                   help="limit each node's network to RATE in tc's units (100mbit, 1gbit) with tc tbf, applied "
                        "by a root helper container before the ranks start (default: unshaped)")
    g.add_argument("--inter-node-latency", default=None, metavar="DELAY",
                   help="refused on this machine: its kernel has no netem, the qdisc that adds delay")
    g.add_argument("--user", default=None, metavar="UID:GID",
                   help="user the containers run as (generate: 1000:1000, the image's; up: yours, or 1000:1000 "
                        "when run as root)")


def _text_only(p: argparse.ArgumentParser) -> None:
    """The job request's options stay text here: the request types them (job/request.py cli_values),
    so the command line and the Python API refuse a bad value with one message."""
    for action in p._actions:
        if action.dest in FIELDS:
            action.type = None


def _target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default=None, help="run folder of an `up` run (default: the newest under runs/)")
    p.add_argument("--file", "-f", dest="file", default=None, help="a compose file instead (e.g. docker-compose.yml)")
    p.add_argument("--project", "-p", default=None, help="compose project name (default: from the run or the file's folder)")


def _prog() -> str:
    """How the user started us: ``python -m launcher`` (a checkout), ``python -m simcluster``, ``simcluster``."""
    arg0 = sys.argv[0] if sys.argv and sys.argv[0] else "simcluster"
    if os.path.basename(arg0) == "__main__.py":
        return "python -m " + os.path.basename(os.path.dirname(os.path.abspath(arg0)))
    return os.path.basename(arg0)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """--target and the options of the real engines' documents (see launcher.launch.EngineOptions)."""
    from simcluster.launcher.engines.registry import DEFAULT, ENGINES, runs_here

    g = parser.add_argument_group("engines (launcher/engines/)")
    g.add_argument("--target", choices=ENGINES, default=DEFAULT, metavar="ENGINE",
                   help=f"the engine: {', '.join(ENGINES)} (default {DEFAULT}; swarm: a Docker Swarm stack); up runs "
                        f"{', '.join(runs_here())} here (swarm: a one-node swarm when there is none)")
    g.add_argument("--workdir", default=None, metavar="DIR",
                   help="slurm: work folder of the job, this project's checkout on shared storage (default: the "
                        "folder sbatch runs in); swarm: absolute folder relative bind-mount sources are taken "
                        "from (default: relative to the stack file)")
    g.add_argument("--setup", default=None, metavar="SHELL",
                   help="slurm: shell line that gives a node torchrun and torch (default: source .venv/bin/activate; "
                        "e.g. 'module load pytorch')")
    g.add_argument("--container-image", default=None, metavar="IMAGE",
                   help="slurm: run torchrun in this registry image through pyxis (srun --container-image)")
    g.add_argument("--runs-claim", default=EngineOptions.runs_claim, metavar="PVC",
                   help=f"jobset/trainjob: PersistentVolumeClaim mounted at /runs, data under its data/ folder "
                        f"(default {EngineOptions.runs_claim})")
    g.add_argument("--hosts", type=int, default=None, metavar="N",
                   help="swarm: rehearse N hosts here (host-0 .. host-N-1, each a Docker engine in a container, one "
                        "swarm, a registry on host-0, the run folder shared); node k runs on host k mod N")
    g.add_argument("--inter-host-bandwidth", default=None, metavar="RATE",
                   help="swarm --hosts: limit each host's link to the others to RATE with tc tbf (e.g. 100mbit); "
                        "nodes on one host are untouched")


def build_parser(doc: str = "") -> argparse.ArgumentParser:
    """The launcher's whole argparse tree, one subparser per command; doc: the help text (cli.py's
    docstring: its first paragraph the description, the rest the epilog)."""
    parser = argparse.ArgumentParser(prog=_prog(), description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(doc.split("\n\n")[1:]))
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the compose file of a mesh (default compose/mesh-PPxDPxTP.yml)")
    gen.add_argument("--out", default=None, help="output file (default, in the repo: compose/mesh-PPxDPxTP.yml; "
                     "swarm/mesh-PPxDPxTP.yml; slurm/mesh-PPxDPxTP.sbatch; k8s/mesh-PPxDPxTP-jobset.yaml, k8s/mesh-PPxDPxTP-trainjob.yaml)")
    gen.add_argument("--stdout", action="store_true", help="print the YAML that would go to --out; write nothing")
    add_config_args(gen)
    add_job_args(gen)
    add_node_args(gen)
    add_engine_args(gen)
    up = sub.add_parser("up", help="run a training job on a fresh cluster, stream its logs, summarise, down")
    add_config_args(up)
    add_job_args(up)
    add_node_args(up)
    add_engine_args(up)
    up.add_argument("--build", action="store_true", help="run images/build.sh even if the image exists")
    up.add_argument("--keep", action="store_true", help="leave the stopped containers (no `down` at the end)")
    up.add_argument("--quiet", action="store_true", help="hide per-step lines; show progress lines instead")
    up.add_argument("--progress-every", type=float, default=10.0, metavar="S", help="seconds between progress lines")
    up.add_argument("--max-restarts", type=int, default=0, metavar="N",
                    help="after a failure restart the whole cluster up to N times, resuming from the run's newest "
                         "checkpoint (use with --ckpt-every; default 0)")
    up.add_argument("--start-late", action="append", default=[], metavar="NODE=S",
                    help="start NODE's container S seconds after the others (late-join drill; repeatable)")
    up.add_argument("--wall-timeout-s", type=float, default=None, metavar="S",
                    help="kill the whole run, restarts included, after S seconds; it fails as timed out (default: "
                         "no limit; --timeout-s is the job's own, ending a run whose peers went silent)")
    up.add_argument("--metric-regex", default=None, metavar="REGEX",
                    help="how the summary reads a loss your ranks only print: one group (the value; n-th match = "
                         "step n) or named groups step and value (default: the common formats, 'loss: 1.2', "
                         "'loss=1.2', 'step 3 | loss 1.2', torchtitan's 'step: 3  loss: 1.2')")
    st = sub.add_parser("status", help="table: node, ranks, state, last step")
    _target_args(st)
    lg = sub.add_parser("logs", help="the cluster's logs (compose logs)")
    _target_args(lg)
    lg.add_argument("--follow", action="store_true", help="keep following")
    lg.add_argument("--tail", default="all", help="lines per container (default all)")
    lg.add_argument("services", nargs="*", help="services, e.g. node-0 rendezvous (default all)")
    dn = sub.add_parser("down", help="stop and remove the cluster's containers and network")
    _target_args(dn)
    ch = sub.add_parser("chaos", help="at step N of a run, kill / pause / disconnect one node (fault drills)")
    _target_args(ch)
    fault = ch.add_mutually_exclusive_group(required=True)
    fault.add_argument("--kill", metavar="NODE", help="docker kill the node's container")
    fault.add_argument("--stop", metavar="NODE", help="docker stop the node's container (SIGTERM)")
    fault.add_argument("--pause", metavar="NODE", help="docker pause (freeze) the node's container")
    fault.add_argument("--freeze", metavar="RANK", type=int,
                       help="SIGSTOP one rank's process inside its node (the node's heartbeat goes on)")
    fault.add_argument("--disconnect", metavar="NODE", help="docker network disconnect the node's container")
    fault.add_argument("--kill-host", metavar="HOST", help="up --hosts: docker kill a rehearsal host's engine (every "
                       "node on it is lost at once; not host-0, the manager)")
    fault.add_argument("--disconnect-host", metavar="HOST", help="up --hosts: cut a rehearsal host off the hosts' "
                       "network")
    ch.add_argument("--at-step", type=int, default=1, metavar="N", help="wait until the run reached step N (default 1)")
    ch.add_argument("--wait-s", type=float, default=3600.0, metavar="S", help="give up after S seconds (default 3600)")
    bd = sub.add_parser("build", help="build the trainer image from this installation's code (images/build.sh, "
                        "package data when installed: no checkout needed)")
    bd.add_argument("--force", action="store_true", help="rebuild the base, the wheelhouse and every layer")
    bd.add_argument("--check", action="store_true", help="build nothing: exit 0 when the image holds this "
                    "installation's code (its code-digest label), 1 when it is missing or holds other code")
    bd.add_argument("--cache-key", action="store_true", help="build nothing: print a key naming this installation's "
                    "image (version, code, Dockerfile, requirements) for a CI cache of `docker save`")
    rp = sub.add_parser("report", help="PNG figures and an HTML page of a run folder with metrics.jsonl")
    rp.add_argument("--run-dir", default=None, help="the run folder (default: the newest under runs/ with a metrics.jsonl)")
    rp.add_argument("--metric-regex", default=None, metavar="REGEX",
                    help="read a loss the ranks only printed (cluster.log) as up does (default: the common formats)")
    pl = sub.add_parser("plan", help="predict per rank memory, traffic per kind and link, and the bubble of a "
                        "trainer run from its shapes and schedule; starts nothing (needs torch)")
    add_config_args(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (bytes, FLOPs) instead of the table")
    pl.add_argument("--hardware", default=None, metavar="NAME", help="predict the step time on h100-sxm-8x, "
                    "a100-80g-8x or local (this machine, calibrated once and cached)")
    pl.add_argument("--recalibrate", action="store_true", help="measure the local hardware model again")
    pl.add_argument("--search", action="store_true", help="rank every mesh and schedule of --world-size by "
                    "predicted step time (default --hardware local)")
    pl.add_argument("--world-size", type=int, default=None, metavar="N", help="ranks for --search")
    pl.add_argument("--memory-per-rank", type=float, default=None, metavar="GB",
                    help="mark (search) or warn about (plan) ranks needing more than GB (1e9 bytes)")
    pj = sub.add_parser("project", help="from a run measured here (--traffic 1 --trace-steps S), the same job's "
                        "step time on other hardware, with its parts (needs torch)")
    pj.add_argument("run_dir", metavar="RUN_DIR", help="the run folder of the built-in trainer")
    pj.add_argument("--hardware", default="local", metavar="NAME",
                    help="h100-sxm-8x, a100-80g-8x or local (default local: this machine, calibrated once and cached)")
    pj.add_argument("--inter-node-bandwidth", default=None, metavar="RATE",
                    help="the target's network between nodes limited to RATE (tc units, as up's flag: 50mbit); "
                         "no effect where the job's ranks fit one node of the target (8 GPUs on the named ones)")
    pj.add_argument("--recalibrate", action="store_true", help="measure the local hardware model again")
    pj.add_argument("--json", action="store_true", help="print the projection as JSON (seconds)")
    _compare_args(sub.add_parser("compare", help="run your code on layout A, then B; compare a metric step by step "
                                 "(exit 1 beyond --rtol)"))
    _sweep_args(sub.add_parser("sweep", help="run your code or the trainer on its own node layout, on one node and on "
                               "one rank per node, the mesh the same; compare a metric step by step (exit 1: differs)"))
    for command in ("generate", "up", "compare", "sweep"):
        _text_only(sub.choices[command])
    parser.commands = sub.choices  # command -> its subparser (the Python API parses `up`'s keywords with it)
    return parser


def _sweep_args(sp: argparse.ArgumentParser) -> None:
    """`sweep` (launcher/sweep.py): `up`'s job, then the metric and its tolerance."""
    add_config_args(sp)
    add_job_args(sp)
    g = sp.add_argument_group("the comparison (against the job's own layout)")
    g.add_argument("--metric", default="loss", help="key of the metrics.jsonl rows to compare (default loss)")
    g.add_argument("--metric-regex", default=None, metavar="REGEX", help="read the metric from what the ranks print "
                   "instead: one group (the value; n-th match = step n) or named groups step and value")
    g.add_argument("--rtol", type=float, default=1e-5, metavar="R", help="largest |X - own| / |own| allowed "
                   "(default 1e-5)")
    g.add_argument("--quiet", action="store_true", help="runs' lines only in their cluster.log; show the table")
    add_node_args(sp)


def _compare_args(cp: argparse.ArgumentParser) -> None:
    """`compare`: your code's flags, layout A (as `up`) and B (--against...), the metric, node options."""
    add_job_args(cp)
    cp.add_argument("--mesh", default=None, metavar="PPxDPxTP",
                    help="layout A, a 3D mesh (or --nodes/--nproc-per-node)")
    g = cp.add_argument_group("layout B and the comparison")
    g.add_argument("--against", default=None, metavar="PPxDPxTP", help="layout B, a 3D mesh (may equal A: determinism)")
    g.add_argument("--against-nodes", type=int, default=None, metavar="N", help="layout B: N nodes (with "
                   "--against-nproc-per-node; 1 and 1: one process)")
    g.add_argument("--against-nproc-per-node", type=int, default=None, metavar="M", help="layout B: M ranks per node")
    g.add_argument("--metric", default="loss", help="key of your metrics.jsonl rows to compare (default loss)")
    g.add_argument("--metric-regex", default=None, metavar="REGEX", help="read the metric from what the ranks print "
                   "instead: one group (the value; n-th match = step n) or named groups step and value")
    g.add_argument("--rtol", type=float, default=1e-5, metavar="R", help="largest |A - B| / |B| allowed (default 1e-5)")
    g.add_argument("--run-dir", default=None, metavar="BASE", help="runs go to BASE/a-<layout>, BASE/b-<layout>, each "
                   "emptied first (default runs/<script or module>-compare)")
    g.add_argument("--timeout-s", type=float, default=60.0, metavar="S", help="each run's timeout (default 60)")
    g.add_argument("--quiet", action="store_true", help="runs' lines only in their cluster.log; show the table")
    g.add_argument("--traffic", type=int, default=0, metavar="0|1", help="1: both runs record their traffic "
                   "(as up --traffic 1)")
    g.add_argument("--trace-steps", default=None, metavar="STEPS", help="both runs trace these steps, e.g. 2 or 2,3")
    add_node_args(cp)
