"""The job request: one frozen, typed description of an `up` or `generate` job, built by one
constructor from Python values; simcluster.run, compare, the pytest fixture and the CLI all use it.

    python -c "from simcluster.launcher.job.request import make_request; print(make_request(mesh='2x1x1', model='tiny', steps=3).given())"

``make_request(command, args=..., **options)`` checks every field once (fields.py: type, range,
finiteness; the mesh's text is parsed once, by options.resolve, which every path runs before it
writes anything; --target's engine is looked up at the door, engines/registry.py), the paths the
containers read (the script, the code folder and the YAML config exist and are readable by the
containers' user), and the fields against each other: a field
that would have no effect in this combination is an error saying why. Every error is a
ConfigError naming the field, the value and a valid example, raised before anything is written.
``cli_values`` types the command line's text (argparse only splits it: launcher/parser.py).
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, fields

from simcluster.launcher.container.layout import IMAGE_USER
from simcluster.launcher.job.checks import gpu_memory_problem
from simcluster.launcher.job.deps import Requirements
from simcluster.launcher.job.env import env_conflicts, env_pairs
from simcluster.launcher.job.fields import FIELDS, GENERATE_ONLY, MAX_STEPS, UP_ONLY, check_values, flag, from_text
from simcluster.launcher.job.sections import (EngineOptions, GenerateOptions, JobOptions, NodeOptions,
                                              TrainerOptions, UpOptions)
from simcluster.core.config import Config, step_spans
from simcluster.core.errors import ConfigError
from simcluster.core.layout import TRAINER_MODULE

COMMANDS = ("up", "generate")
SHARED = ("mesh", "run_dir", "timeout_s", "stall_s")  # Config fields that are launcher options for any job
INSTRUMENTS = ("traffic", "trace_steps", "profile_step", "check_collectives")  # trainer flags that instrument the user's code too


@dataclass(frozen=True)
class JobRequest(GenerateOptions, UpOptions, EngineOptions, NodeOptions, JobOptions, TrainerOptions):
    """One job: every option of `up` (or `generate`) a typed field, declared once in its section
    (job/sections.py: the trainer's Config, the job, the node, the engine, the run, generate's output),
    its default, range, example and help in the field's metadata; ``command`` and ``args`` (your
    code's arguments). Build it with make_request, which checks them all."""

    command: str = "up"
    args: tuple[str, ...] = ()

    def __post_init__(self):  # unset stays unset here: `up` runs as you, `generate` as the image's user
        pass

    def given(self) -> dict:
        """The fields set to other than their defaults (``args``: the job's arguments), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "command"
                and getattr(self, f.name) != f.default}

    @property
    def builtin(self) -> bool:
        """The built-in trainer: no script, no code folder, and no module (or the trainer's own)."""
        return self.script is None and self.code is None and self.module in (None, TRAINER_MODULE)

    def section(self, cls):
        """One section of the request (NodeOptions, EngineOptions, UpOptions, ...) with its values."""
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})


def _error(name: str, message: str) -> ConfigError:
    e = ConfigError(message)
    e.field = name
    return e


def unknown(name: str, known, what: str = "run() takes `launcher up`'s options by name") -> ConfigError:
    """The error of a keyword that is no option, the close ones named."""
    close = difflib.get_close_matches(name, list(known), n=3)
    return _error(name, f"unknown keyword argument {name!r} (on the command line: unrecognized arguments: "
                        f"{flag(name)}){'; did you mean ' + ', '.join(close) if close else ''}? {what}, e.g. "
                        f"steps=3 for --steps 3 (all: python -m launcher up --help)")


def _argv(args) -> tuple[str, ...]:
    if isinstance(args, str):
        raise _error("args", f"args: a list of your code's arguments, e.g. args=['--steps', '3'], not the "
                             f"string {args!r}")
    if not isinstance(args, (list, tuple)) or any(isinstance(a, bool) or not isinstance(a, (str, int, float))
                                                  for a in args):
        raise _error("args", f"args: a list of your code's arguments (text or numbers), e.g. args=['--steps', "
                             f"'3'], got {args!r}")
    return tuple(map(str, args))


def _readable(name: str, path: str, user: str, folder: bool) -> None:
    """The path exists, is a file (or a folder) and the containers' user can read it."""
    from simcluster.launcher.job.entry import unreadable

    path = os.path.abspath(path)
    what = "an existing folder" if folder else "an existing file"
    if not (os.path.isdir(path) if folder else os.path.isfile(path)):
        pick = {"script": ".py file", "code": "folder that holds your code", "config": "YAML file"}[name]
        raise _error(name, f"{name}: {path} does not exist{'' if not os.path.exists(path) else ' as ' + what}; "
                           f"pass an existing {pick}, e.g. {flag(name)} "
                           f"{FIELDS[name].example}")
    if name != "config" and (why := unreadable(path, user)):
        raise _error(name, f"{name}: {why}")


def _trace_steps(values: dict, last: int | None) -> None:
    """trace_steps and profile_step within 1..last (the run's last step when known), each range
    checked before any list of its steps is built; then core/config.py step_spans' own refusals (a step given
    twice), which build none either."""
    bound = last or MAX_STEPS
    if values["profile_step"] and values["profile_step"] > bound:
        raise _error("profile_step", f"profile_step: step {values['profile_step']} is after the run's last step "
                                     f"({bound}); e.g. profile_step=2 (--profile-step 2)")
    text = values["trace_steps"]
    for part in (text or "").replace(" ", "").split(",") if text and text.strip() else ():
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, 0)
        if not m or not 1 <= lo <= hi or hi > bound:
            why = "does not parse" if not m else f"lies outside the run's steps 1..{bound}" if lo <= hi else \
                "runs backwards"
            raise _error("trace_steps", f"trace_steps: {part!r} in {text!r} {why}; write steps as 3,4 or 3-5 "
                                        f"within the run, e.g. trace_steps='2,3' (--trace-steps 2,3)")
    try:
        step_spans(text, bound)
    except ConfigError as e:
        raise _error("trace_steps", str(e)) from None


# The options of your own code's runs the built-in trainer refuses -> what it takes instead.
_DEVICE = "the built-in trainer runs on --device cpu or cuda (a real GPU), never a simulated one: drop it"
OWN_CODE_ONLY = {"total_steps": "the built-in trainer takes --steps N", "no_cpu_bridges": _DEVICE,
                 "no_simulated_gpus": _DEVICE, "gpu": _DEVICE, "gpu_memory": _DEVICE, "check_devices": _DEVICE}


def _combination(v: dict, argv: tuple, builtin: bool) -> None:
    """A field that would have no effect with the others, or two that contradict: an error saying why."""
    if v["script"] is not None and v["module"] is not None:
        raise _error("module", f"module: {v['module']!r} has no effect with script {v['script']!r} (the script "
                               f"runs); give one, e.g. script='examples/ddp.py' or module='mypkg.train'")
    if v["strict_memory"] and v["memory_per_node"] is None:
        raise _error("strict_memory", "--strict-memory: needs the limit to check, e.g. --memory-per-node 3g")
    if builtin:
        if v["nodes"] is not None or v["nproc_per_node"] is not None or argv:
            raise _error("nodes", "the built-in trainer takes --mesh and its own flags, not --nodes/--nproc-per-node "
                                  "or arguments after --; to run your code, add --script FILE or --module NAME")
        own = [n for n in OWN_CODE_ONLY if v.get(n) not in (None, False)]
        if own:
            name = own[0]
            given = "" if v[name] is True else f" {v[name]}"
            raise _error(name, f"{flag(name)}{given}: an option of your own code's runs; {OWN_CODE_ONLY[name]}")
        return
    if v.get("no_cpu_bridges") and not v.get("no_simulated_gpus"):
        raise _error("no_cpu_bridges", "--no-cpu-bridges: the simulated GPUs need the CPU bridges (a \"cuda\" mesh is a "
                                       "CPU mesh: its attention and random ops are bridged); turn both off, e.g. "
                                       "--no-cpu-bridges --no-simulated-gpus")
    if v.get("gpu") is not None and v.get("no_simulated_gpus"):
        raise _error("gpu", f"--gpu {v['gpu']}: no effect with --no-simulated-gpus; drop one: --gpu (the simulated "
                            f"GPU's model) or --no-simulated-gpus (no simulated GPU)")
    if v.get("check_devices") and v.get("no_simulated_gpus"):
        raise _error("check_devices", "--check-devices: checks the simulated GPUs' tensors, none with "
                                      "--no-simulated-gpus; drop one: --check-devices (mixed cuda and CPU tensors "
                                      "refused) or --no-simulated-gpus")
    if v.get("gpu_memory") is not None:
        if v.get("no_simulated_gpus"):
            raise _error("gpu_memory", f"--gpu-memory {v['gpu_memory']}: no effect with --no-simulated-gpus; drop "
                                       f"one: --gpu-memory (the simulated GPU's memory) or --no-simulated-gpus")
        if problem := gpu_memory_problem(v["gpu_memory"], v.get("gpu")):
            raise _error("gpu_memory", problem)
    defaults = Config()
    trainer_only = [f.name for f in fields(Config) if f.name not in SHARED + INSTRUMENTS
                    and v[f.name] not in (None, getattr(defaults, f.name))]
    if v["strict_memory"]:
        raise _error("strict_memory", "--strict-memory: the memory prediction is the built-in trainer's (its "
                                      "shapes); your code's memory is not predicted: drop --strict-memory")
    if trainer_only or v["config"]:
        given = ", ".join(flag(n) for n in trainer_only) or f"--config {v['config']}"
        typed = " ".join(f"{flag(n)} {v[n]}" for n in trainer_only) or f"--config {v['config']}"
        ours = f"; your code's step count for the progress line is --total-steps {v['steps']}" \
            if "steps" in trainer_only else ""
        raise _error(trainer_only[0] if trainer_only else "config",
                     f"{given}: options of the built-in trainer, not of your code; where your code takes them, "
                     f"pass them after --, e.g. ... -- {typed}{ours}")
    if v["mesh"] is not None and (v["nodes"] is not None or v["nproc_per_node"] is not None):
        raise _error("mesh", "invalid launch:\n  shape: give either --mesh PPxDPxTP or --nodes N --nproc-per-node "
                             "M, not both")
    if v["nodes"] is not None and v["nproc_per_node"] is None or v["nproc_per_node"] is not None and v["nodes"] is None:
        name = "nproc_per_node" if v["nproc_per_node"] is None else "nodes"
        raise _error(name, f"shape: --nodes and --nproc-per-node go together, {name} is missing (got nodes "
                           f"{v['nodes']}, nproc_per_node {v['nproc_per_node']}); e.g. nodes=2, nproc_per_node=2 "
                           f"(--nodes 2 --nproc-per-node 2)")


def make_request(command: str = "up", *, args=(), **options) -> JobRequest:
    """The one constructor of a JobRequest: ``make_request("up", model="tiny", steps=3)``; args: your
    code's arguments. Unset options (None) take their defaults. Nothing is written.

    Raises:
        ConfigError: an unknown keyword (the close ones named), a value of the wrong type, out of its
            range, not finite, a missing or unreadable script, code folder or config, a bad mesh, or a
            combination in which a field has no effect; naming the field, the value and an example.
    """
    if command not in COMMANDS:
        raise _error("command", f"command: one of {', '.join(COMMANDS)}, got {command!r}; e.g. command='up'")
    allowed = [n for n in FIELDS if n not in (GENERATE_ONLY if command == "up" else UP_ONLY)]
    for name in options:
        if name not in allowed:
            raise unknown(name, allowed)
    argv = _argv(args)
    values = check_values(allowed, options)
    check_text(values, argv)
    builtin = values["script"] is None and values["code"] is None and values["module"] in (None, TRAINER_MODULE)
    _combination(values, argv, builtin)
    steps = (values["steps"] or (Config.steps if values["config"] is None else None)) if builtin \
        else values["total_steps"]
    _trace_steps(values, steps)
    user = values["user"] or (IMAGE_USER if command == "generate" else _container_user())
    for name, folder in (("script", False), ("code", True), ("config", False)):
        if values[name] is not None:
            _readable(name, values[name], user, folder)
    Requirements(values["requirements"], values["wheel"]).check()
    env_conflicts(env_pairs(values["env"]), values["check_collectives"], values["stall_s"])
    return JobRequest(command=command, args=argv, **values)


def _container_user() -> str:
    from simcluster.launcher.job.files import container_user

    return container_user()


def check_text(values: dict, argv: tuple) -> None:
    """Every text value and each of the job's arguments is free of control characters (job/checks.py:
    newline, tab, other C0, DEL, C1, U+2028/9): each lands in the generated document, whose header
    names them on one comment line.

    Raises:
        ConfigError: naming every such option or argument, e.g. ``--run-dir: 'runs/a\\nb' holds ...``.
    """
    from simcluster.launcher.job.checks import example, text_errors

    document = "the generated file carries it (its header comment, labels, run id, mounts or commands)"
    given = {flag(k): list(v) if isinstance(v, tuple) else v for k, v in values.items() if v != FIELDS[k].default}
    errors = text_errors(given, document, lambda f: f"remove it, e.g. {example(f)}")
    errors += text_errors({f"argument {i} after --": a for i, a in enumerate(argv, 1)}, document,
                          lambda _: "pass such text in a file your code reads, e.g. -- --notes notes.txt")
    if errors:
        raise ConfigError("\n  ".join(["invalid launch:", *errors]))


def cli_values(namespace: dict) -> dict:
    """The command line's values (argparse's namespace as a dict) typed: text of a number field ->
    the number (``"3"`` -> 3), ``job_argv`` -> ``args``; every other entry as it is.

    Raises:
        ConfigError: text that is no number of its field's kind (check_value's message).
    """
    out = {}
    for name, value in namespace.items():
        if name == "job_argv":
            out["args"] = tuple(value)
        elif name in FIELDS and isinstance(value, str):
            out[name] = from_text(name, value)
        else:
            out[name] = value
    return out


def request_from_cli(namespace: dict) -> JobRequest:
    """`up`'s or `generate`'s parsed command line -> its JobRequest (make_request's errors)."""
    values = cli_values(namespace)
    command = values.pop("command")
    return make_request(command, **{k: v for k, v in values.items() if k in FIELDS or k == "args"})
