"""The launcher's job and node flags, and the edge: parsed flags -> one frozen Launch.

    python -m launcher up --mesh 2x2x2 --script examples/manual_3d.py -- --steps 5
    python -m launcher generate --nodes 2 --nproc-per-node 2 --script examples/ddp.py --out ddp.yml

The built-in trainer runs when neither --script nor --code is given and --module is ``train``
(the default); its options are the trainer's own flags. Otherwise the user's code runs
(launcher/job/entry.py resolve_code) with the arguments after ``--``, and trainer options are refused.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from dataclasses import fields

from simcluster.launcher.job.checks import example, memory_bytes, run_dir_problem, text_errors
from simcluster.launcher.job.files import host_abspath, repo_path
from simcluster.launcher.instrument.spec import Instruments
from simcluster.launcher.job.entry import parse_mount, resolve_code, resolve_training
from simcluster.launcher.job.launch import RDZV_BACKENDS, EngineOptions, Launch, NodeOptions, check_engine_options
from simcluster.launcher.container.layout import JOIN_TIMEOUT_S
from simcluster.train.layout import TRAINER_MODULE
from simcluster.train.cli import config_from_args
from simcluster.train.config import Config
from simcluster.train.errors import ConfigError

SHARED = ("mesh", "run_dir", "timeout_s")  # Config fields that are launcher options for any job
INSTRUMENTS = ("traffic", "trace_steps", "profile_step")  # trainer flags that instrument the user's code too
UP_ONLY = ("build", "keep", "quiet", "progress_every", "max_restarts", "start_late", "wall_timeout_s")  # not in `generate`


def split_job_argv(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """(the launcher's own arguments, the job's arguments after the first ``--``)."""
    if "--" not in argv:
        return list(argv), ()
    i = argv.index("--")
    return list(argv[:i]), tuple(argv[i + 1:])


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


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """Container options of every node (see launcher.launch.NodeOptions)."""
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


def engine_options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(workdir=getattr(args, "workdir", None), setup=getattr(args, "setup", None),
                         container_image=getattr(args, "container_image", None),
                         runs_claim=getattr(args, "runs_claim", EngineOptions.runs_claim))


def node_options(args: argparse.Namespace, user: str) -> NodeOptions:
    return NodeOptions(cpus_per_node=args.cpus_per_node, memory_per_node=args.memory_per_node, image=args.image,
                       rdzv_backend=args.rdzv_backend, mount_code=args.mount_code,
                       join_timeout_s=args.join_timeout_s, torchrun=args.torchrun, user=args.user or user,
                       inter_node_bandwidth=args.inter_node_bandwidth, inter_node_latency=args.inter_node_latency)


def instruments(cfg: Config, args: argparse.Namespace) -> Instruments:
    """The instruments of a user-code job from --traffic, --trace-steps/--profile-step, --total-steps
    and --no-cpu-bridges.

    Raises:
        ConfigError: --traffic not 0 or 1, --total-steps below 1, a traced step that does not parse
            or lies beyond --total-steps.
    """
    from simcluster.train.config import parse_steps

    if cfg.traffic not in (0, 1):
        raise ConfigError(f"--traffic: 0 or 1, got {cfg.traffic}; e.g. --traffic 1")
    if args.total_steps is not None and args.total_steps < 1:
        raise ConfigError(f"--total-steps: must be >= 1, got {args.total_steps}; e.g. --total-steps 5")
    steps = set(parse_steps(cfg.trace_steps, args.total_steps or 10**9))
    if cfg.profile_step:
        steps |= set(parse_steps(str(cfg.profile_step), args.total_steps or 10**9))
    return Instruments(traffic=bool(cfg.traffic), trace_steps=tuple(sorted(steps)), total_steps=args.total_steps,
                       cpu_bridges=not args.no_cpu_bridges)


def is_builtin(args: argparse.Namespace) -> bool:
    """The built-in trainer: no --script, no --code, and no --module (or the trainer's own)."""
    return args.script is None and args.code is None and args.module in (None, TRAINER_MODULE)


def resolve(args: argparse.Namespace, user: str, parser: argparse.ArgumentParser) -> tuple[Launch, str]:
    """The edge: flags -> (Launch, the canonical ``launcher generate`` line of these options).
    Paths the user typed are taken relative to the cwd and named repo-relative when inside the
    repo, else absolute. One mesh parse.

    Raises:
        ConfigError: a bad mesh, config field, data path, script, module, mount or node option.
    """
    check_typed(args)
    cfg = config_from_args(args)
    check_config_text(cfg, args)
    node = node_options(args, user)
    if is_builtin(args):
        if args.nodes is not None or args.nproc_per_node is not None or args.job_argv:
            raise ConfigError("the built-in trainer takes --mesh and its own flags, not --nodes/--nproc-per-node "
                              "or arguments after --; to run your code, add --script FILE or --module NAME")
        if args.total_steps is not None or args.no_cpu_bridges:
            raise ConfigError(f"{'--total-steps' if args.total_steps is not None else '--no-cpu-bridges'}: an "
                              f"option of your own code's runs; the built-in trainer takes --steps N")
        paths = {k: os.path.abspath(getattr(cfg, k)) for k in ("data", "run_dir") if getattr(cfg, k) is not None}
        launch = resolve_training(dataclasses.replace(cfg, **paths), node, tuple(args.mount), host_path=repo_path)
        check_memory(launch, args.strict_memory)
    else:
        defaults = Config()
        trainer_only = [f.name for f in fields(Config) if f.name not in SHARED + INSTRUMENTS
                        and getattr(cfg, f.name) not in (None, getattr(defaults, f.name))]
        if args.strict_memory:
            raise ConfigError("--strict-memory: the memory prediction is the built-in trainer's (its shapes); "
                              "your code's memory is not predicted: drop --strict-memory")
        if trainer_only or args.config:
            given = ", ".join("--" + n.replace("_", "-") for n in trainer_only) or f"--config {args.config}"
            raise ConfigError(f"{given}: options of the built-in trainer, not of your code; pass your code's own "
                              f"arguments after --, e.g. ... --script train.py -- --lr 0.1")
        launch = resolve_code(node, script=args.script, module=None if args.script else args.module, code=args.code,
                              argv=args.job_argv, mesh=args.mesh, nodes=args.nodes,
                              nproc_per_node=args.nproc_per_node, run_dir=args.run_dir,
                              timeout_s=cfg.timeout_s, mounts=tuple(args.mount), host_path=repo_path)
        launch = dataclasses.replace(launch, instruments=instruments(cfg, args))
    launch = dataclasses.replace(launch, engine=engine_options(args))
    _raise(check_engine_options(launch.engine))
    command = generate_command(args, parser, launch)
    check_resolved(launch, command)
    return launch, command


def check_memory(launch: Launch, strict: bool) -> None:
    """The built-in trainer's predicted tensors per node (train/plan/fit.py) against --memory-per-node:
    a warning on stderr per node over it, or with ``strict`` (--strict-memory) a refusal.

    Raises:
        ConfigError: --strict-memory without --memory-per-node, or a node over it under --strict-memory,
            or --strict-memory where torch (the planner's) is missing.
    """
    limit = launch.node.memory_per_node
    if limit is None:
        if strict:
            raise ConfigError("--strict-memory: needs the limit to check, e.g. --memory-per-node 3g")
        return
    try:
        from simcluster.train.plan.fit import over_memory
    except ImportError as e:  # the torch-free install: nothing to predict with
        if strict:
            raise ConfigError(f"--strict-memory: the memory prediction needs torch ({e}); pip install "
                              f"'simcluster[torch]', or drop --strict-memory") from None
        return
    lines = over_memory(launch.train, memory_bytes(limit), f"--memory-per-node {limit}")
    if lines and strict:
        raise ConfigError("\n  ".join(["memory (--strict-memory):", *lines]))
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


DOCUMENT = "the generated file carries it (its header comment, labels, run id, mounts or commands)"


def _raise(errors: list[str]) -> None:
    if errors:
        raise ConfigError("\n  ".join(["invalid launch:", *errors]))


def check_typed(args: argparse.Namespace) -> None:
    """Every string typed on the command line, each flag's value and each of the job's arguments
    after ``--``, is free of control characters (launcher/job/checks.py: newline, tab, other C0, DEL,
    C1, U+2028/9): each lands in the generated document, whose header names them on one comment line.

    Raises:
        ConfigError: naming every such flag or argument, e.g. ``--run-dir: 'runs/a\\nb' holds ...``.
    """
    flags = {"--" + k.replace("_", "-"): v for k, v in vars(args).items() if k not in ("command", "job_argv")}
    errors = text_errors(flags, DOCUMENT, lambda flag: f"remove it, e.g. {example(flag)}")
    errors += text_errors({f"argument {i} after --": a for i, a in enumerate(args.job_argv, 1)}, DOCUMENT,
                          lambda _: "pass such text in a file your code reads, e.g. -- --notes notes.txt")
    _raise(errors)


def check_config_text(cfg: Config, args: argparse.Namespace) -> None:
    """The string fields of the config (from --config YAML; the flags are check_typed's) are free of
    control characters: the trainer's flags in every node's command carry them.

    Raises:
        ConfigError: naming each field and the file, e.g. ``data (in --config run.yaml): ...``.
    """
    values = {f"{f.name} (in --config {args.config})": getattr(cfg, f.name) for f in fields(Config)}
    _raise(text_errors(values, DOCUMENT, lambda name: f"remove it from {args.config}, e.g. data: data/corpus.txt"))


def check_resolved(launch: Launch, command: str) -> None:
    """What the Launch got from the current folder, the defaults and the typed paths: the run folder can
    be a folder (not an existing file, no file among its parents), and no path or header line holds a
    control character (an absolute path takes the current folder's).

    Raises:
        ConfigError: e.g. ``run_dir: /tmp/x exists and is not a folder; ... e.g. --run-dir runs/mesh-2x2x2``.
    """
    errors = []
    if why := run_dir_problem(host_abspath(launch.run_dir)):
        errors.append(f"run_dir: {why}; the run folder is where the job writes, so it must be a folder; pass "
                      f"another, e.g. --run-dir runs/mesh-2x2x2")
    values = {"run_dir": launch.run_dir, "mount source": [m.source for m in launch.mounts],
              "the header's regenerate line": command}
    errors += text_errors(values, DOCUMENT + ", from the current folder", lambda _: "start the launcher from a "
                          "folder whose path has none, or pass absolute paths without them")
    _raise(errors)


def _canonical(name: str, value):
    """A flag value as the header shows it: paths repo-relative, the mesh normalised."""
    if name in ("data", "run_dir", "script", "code", "out"):
        return repo_path(value)
    if name == "mount":
        src, dst, mode = parse_mount(value)
        return f"{repo_path(src)}:{dst}:{mode}"
    return value


def generate_command(args: argparse.Namespace, parser: argparse.ArgumentParser, launch: Launch) -> str:
    """``python -m launcher generate`` with every option the user set (paths as the compose file
    names them, the mesh normalised, the job's arguments after --): a generated file's header."""
    defaults = vars(parser.parse_args([args.command]))
    parts = ["python -m launcher generate"]
    if launch.mesh:
        parts += ["--mesh", str(launch.mesh)]
    values = vars(args)
    for name, value in sorted(values.items(), key=lambda kv: kv[0] == "out"):  # --out last
        if name in ("command", "job_argv", "mesh", "stdout", *UP_ONLY) or value in (None, defaults.get(name)):
            continue
        flag = "--" + name.replace("_", "-")
        for v in value if isinstance(value, list) else [value]:
            parts += [flag] if v is True else [flag, shlex.quote(str(_canonical(name, v)))]
    if args.job_argv:
        parts += ["--", *map(shlex.quote, args.job_argv)]
    return " ".join(parts)
