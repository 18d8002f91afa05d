"""The edge: one checked JobRequest (request.py) -> one frozen Launch and its ``generate`` line.

    python -c "from simcluster.launcher.job.request import make_request; from simcluster.launcher.job.options import resolve; print(resolve(make_request('generate', mesh='2x1x1', model='tiny'), '1000:1000')[1])"

The built-in trainer runs when neither a script nor a code folder is given and the module is
``train`` (the default); its options are the trainer's own. Otherwise the user's code runs
(launcher/job/entry.py resolve_code) with its arguments, and trainer options are refused.
No argparse here: the command line is cli.py's and parser.py's.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from dataclasses import fields

from simcluster.launcher.job.deps import Requirements
from simcluster.launcher.job.env import env_pairs
from simcluster.launcher.job.checks import example, memory_bytes, run_dir_problem, size_bytes, text_errors
from simcluster.launcher.job.fields import FIELDS, UP_ONLY, flag
from simcluster.launcher.job.files import host_abspath, repo_path
from simcluster.launcher.instrument.spec import DEFAULT_GPU, Instruments
from simcluster.launcher.job.entry import parse_mount, resolve_code, resolve_training
from simcluster.launcher.job.launch import EngineOptions, Launch, NodeOptions, check_engine_options
from simcluster.launcher.job.request import JobRequest
from simcluster.core.flags import load_yaml
from simcluster.core.config import Config
from simcluster.core.config_types import config_from_dict
from simcluster.core.errors import ConfigError


def split_job_argv(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """(the launcher's own arguments, the job's arguments after the first ``--``)."""
    if "--" not in argv:
        return list(argv), ()
    i = argv.index("--")
    return list(argv[:i]), tuple(argv[i + 1:])


def instruments(cfg: Config, req: JobRequest) -> Instruments:
    """The instruments of a user-code job from traffic, trace_steps/profile_step, total_steps and
    no_cpu_bridges (their ranges are the request's: no step list is built from an unchecked range).

    Raises:
        ConfigError: traffic not 0 or 1, a traced step that does not parse or lies beyond total_steps.
    """
    from simcluster.core.config import parse_steps

    from simcluster.core.preflight_values import RULES
    from simcluster.core.hang import stall_limit

    if cfg.traffic not in (0, 1):
        raise ConfigError(f"--traffic: 0 or 1, got {cfg.traffic}; e.g. --traffic 1")
    if cfg.check_collectives not in (0, 1):
        raise ConfigError(f"--check-collectives: 0 or 1, got {cfg.check_collectives}; e.g. --check-collectives 1")
    ok, need, fix = RULES["stall_s"]
    if not ok(cfg.stall_s):
        raise ConfigError(f"--stall-s: must be {need}, got {cfg.stall_s}; {fix}")
    last = req.total_steps or 10**7
    steps = set(parse_steps(cfg.trace_steps, last))
    if cfg.profile_step:
        steps |= set(parse_steps(str(cfg.profile_step), last))
    return Instruments(traffic=bool(cfg.traffic), trace_steps=tuple(sorted(steps)), total_steps=req.total_steps,
                       cpu_bridges=not req.no_cpu_bridges, simulated_gpus=not req.no_simulated_gpus,
                       gpu=req.gpu or DEFAULT_GPU,
                       gpu_memory=size_bytes(req.gpu_memory) if req.gpu_memory else None,
                       check_devices=req.check_devices,
                       stall_s=stall_limit(cfg.stall_s, cfg.timeout_s),
                       stall_given=req.stall_s is not None, gpu_given=req.gpu is not None,
                       check_collectives=bool(cfg.check_collectives))


def config_of(req: JobRequest) -> Config:
    """The trainer's Config: the YAML file (``config``) updated by every field the request sets.

    Raises:
        ConfigError: the YAML is missing, unparsable, or holds a bad or unknown field.
    """
    values = load_yaml(req.config) if req.config else {}
    values.update({f.name: getattr(req, f.name) for f in fields(Config) if getattr(req, f.name) is not None})
    return config_from_dict(values, source=req.config or "flags")


def _abs(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def resolve(req: JobRequest, user: str) -> tuple[Launch, str]:
    """The edge: a checked request -> (Launch, the canonical ``launcher generate`` line of it).
    Paths are taken relative to the cwd and named repo-relative when inside the repo, else absolute.

    Raises:
        ConfigError: a bad config field, data path, script, module, mount, node or engine option.
    """
    cfg = config_of(req)
    check_config_text(cfg, req)
    node = dataclasses.replace(req.section(NodeOptions), user=req.user or user)
    if req.builtin:
        paths = {k: os.path.abspath(getattr(cfg, k)) for k in ("data", "run_dir") if getattr(cfg, k) is not None}
        launch = resolve_training(dataclasses.replace(cfg, **paths), node, req.mount, host_path=repo_path)
        check_memory(launch, node.strict_memory)
    else:
        launch = resolve_code(node, script=req.script, module=req.module, code=req.code, argv=req.args,
                              mesh=req.mesh, nodes=req.nodes, nproc_per_node=req.nproc_per_node,
                              run_dir=req.run_dir, timeout_s=cfg.timeout_s, mounts=req.mount, host_path=repo_path,
                              installs=bool(req.requirements or req.wheel))
        launch = dataclasses.replace(launch, instruments=instruments(cfg, req))
    launch = dataclasses.replace(launch, engine=req.section(EngineOptions),
                                 requirements=Requirements(_abs(req.requirements), tuple(map(_abs, req.wheel))),
                                 env=env_pairs(req.env))
    _raise(check_engine_options(launch.engine))
    command = generate_command(req, launch)
    check_resolved(launch, command)
    if req.command == "generate" and launch.node.inter_node_bandwidth:  # no effect in a file: up applies it
        raise ConfigError(f"--inter-node-bandwidth {launch.node.inter_node_bandwidth}: applied by `python -m launcher "
                          f"up` (a helper container shapes each node once it runs, then the node starts its ranks); a "
                          f"compose file alone cannot apply it: use launcher up, or drop the option")
    return launch, command


def check_memory(launch: Launch, strict: bool) -> None:
    """The built-in trainer's predicted tensors per node (train/plan/fit.py) against --memory-per-node:
    a warning on stderr per node over it, or with ``strict`` (--strict-memory) a refusal.

    Raises:
        ConfigError: a node over --memory-per-node under --strict-memory, or --strict-memory where
            torch (the planner's) is missing.
    """
    limit = launch.node.memory_per_node
    if limit is None:  # --strict-memory without a limit: the request refused it (job/request.py)
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


def check_config_text(cfg: Config, req: JobRequest) -> None:
    """The string fields of the config (from the YAML file; the request's own were checked by make_request) are
    free of control characters: the trainer's flags in every node's command carry them.

    Raises:
        ConfigError: naming each field and the file, e.g. ``data (in --config run.yaml): ...``.
    """
    values = {f"{f.name} (in --config {req.config})": getattr(cfg, f.name) for f in fields(Config)}
    _raise(text_errors(values, DOCUMENT, lambda name: f"remove it from {req.config}, e.g. data: data/corpus.txt"))


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
    if name in ("data", "run_dir", "script", "code", "out", "requirements", "wheel"):
        return repo_path(value)
    if name == "mount":
        src, dst, mode = parse_mount(value)
        return f"{repo_path(src)}:{dst}:{mode}"
    return value


def generate_command(req: JobRequest, launch: Launch) -> str:
    """``python -m launcher generate`` with every option the request set (paths as the compose file
    names them, the mesh normalised, the job's arguments after --): a generated file's header."""
    parts = ["python -m launcher generate"]
    if launch.mesh:
        parts += ["--mesh", str(launch.mesh)]
    given = req.given()
    for name in sorted(FIELDS, key=lambda n: n == "out"):  # the command line's order, --out last
        value = given.get(name)
        if name in ("mesh", "stdout", *UP_ONLY) or value is None or value is False or value == ():
            continue
        for v in value if isinstance(value, tuple) else [value]:
            parts += [flag(name)] if v is True else [flag(name), shlex.quote(str(_canonical(name, v)))]
    if req.args:
        parts += ["--", *map(shlex.quote, req.args)]
    return " ".join(parts)
