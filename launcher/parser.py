"""The launcher's flags as one argparse tree: every command's subparser (cli.py dispatches on it); the
flags of `up`, `generate` and `compare` made from their one declaration (job/sections.py).

    python -c "from simcluster.launcher.parser import build_parser; build_parser().parse_args(['up', '--help'])"

Only the command line builds or calls it (cli.py): the Python API takes keywords (job/request.py).
The job request's options stay text here and are typed by the request, so both refuse a bad value
with one message. The trainer's own flags are simcluster/core/flags.py's. Around argparse, for cli.py:
``fix_negative_values`` before parsing (a negative value passed on to its check), ``given_twice`` after
(a flag given twice is refused, never the last silently kept).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from simcluster.launcher.job.fields import FIELDS, flag
from simcluster.launcher.job.sections import (COMPARE_RUN, COMPARE_TRAINER, FULL_SIZE_JOB, SWEEP_COMPARE, CompareOptions,
                                              EngineOptions, GenerateOptions, JobOptions, NodeOptions,
                                              TrainerOptions, UpOptions, specs)
from simcluster.core.flags import add_config_args, field_docs
from simcluster.core.config import Config


def _help(s) -> str:
    """A field's help, its door's words filled in, its default named."""
    text = s.help.format(**_door_words()) if s.door else s.help
    text += f"; one of {', '.join(s.choices)}" if s.choices else ""
    return text + (f" (default {s.default})" if s.default not in (None, False, ()) else "")


def _door_words() -> dict:
    from simcluster.launcher.engines.registry import DEFAULT, ENGINES, runs_here

    return {"engines": ", ".join(ENGINES), "runs_here": ", ".join(runs_here()), "default": DEFAULT}


def _door_choices(door: str) -> list[str]:
    """The table at the door a field's value names (the request keeps it as text): --target's engines."""
    from simcluster.launcher.engines.registry import ENGINES

    return {"engines": list(ENGINES)}[door]


def add_section(parser: argparse.ArgumentParser, section, only: tuple[str, ...] = (), typed: bool = False,
                title: str = "") -> None:
    """One flag per field of a section (job/sections.py), in a group of its title: a switch for a bool, a
    repeatable flag for a list, else a value; ``only``: these fields alone. The request's values stay text
    (default None: the request applies the field's default); ``typed``: argparse types them and the
    field's default is the flag's (compare's own options, which no request takes); ``title``: the group's,
    instead of the section's."""
    g = parser.add_argument_group(title or section.title)
    for name, s in specs(section).items():
        if only and name not in only:
            continue
        kw: dict = {"dest": name, "help": _help(s)}
        if s.kind == "bool":
            kw["action"] = "store_true"
        elif s.kind in ("strs", "pairs"):
            kw.update(action="append", default=[], metavar=s.metavar)
        else:
            kw.update(default=s.default if typed else None, metavar=s.metavar,
                      type={"int": int, "float": float}.get(s.kind) if typed else None)
        if s.door:
            kw["choices"] = _door_choices(s.door)
        g.add_argument(s.flag, **kw)


def add_trainer_args(parser: argparse.ArgumentParser, only: tuple[str, ...]) -> None:
    """Some of the trainer's flags (compare's: mesh, run_dir, ...), their help Config's docstrings."""
    docs = field_docs()
    g = parser.add_argument_group(TrainerOptions.title)
    for name in only:
        default = getattr(Config, name)
        g.add_argument(flag(name), dest=name, default=None, help=f"{docs.get(name, '')} (default: {default})")


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


def build_parser(doc: str = "", only: str | None = None) -> argparse.ArgumentParser:
    """The launcher's argparse tree, one subparser per command (COMMANDS); doc: the help text (cli.py's
    docstring: its first paragraph the description, the rest the epilog). only: that command's flags alone
    are made (the others' subparsers stay bare: the command line runs one command); None: every command's."""
    parser = argparse.ArgumentParser(prog=_prog(), description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(doc.split("\n\n")[1:]))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (text, fill) in COMMANDS.items():
        command = sub.add_parser(name, help=text)
        if only in (None, name):
            fill(command)
            if name in ("generate", "up", "compare", "sweep"):
                _text_only(command)
    parser.commands = sub.choices  # command -> its subparser (the Python API parses `up`'s keywords with it)
    return parser


def _job_args(p: argparse.ArgumentParser, own) -> None:
    """`generate` and `up`: the trainer's flags, then the job's, the node's, the engine's and the command's own."""
    add_config_args(p)
    for section in (JobOptions, NodeOptions, EngineOptions, own):
        add_section(p, section)


def _logs_args(lg: argparse.ArgumentParser) -> None:
    _target_args(lg)
    lg.add_argument("--follow", action="store_true", help="keep following")
    lg.add_argument("--tail", default="all", help="lines per container (default all)")
    lg.add_argument("services", nargs="*", help="services, e.g. node-0 rendezvous (default all)")


def _report_args(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("--run-dir", default=None, help="the run folder (default: the newest under runs/ with a metrics.jsonl)")
    rp.add_argument("--metric-regex", default=None, metavar="REGEX",
                    help="read a loss the ranks only printed (cluster.log) as up does (default: the common formats)")


def _chaos_args(ch: argparse.ArgumentParser) -> None:
    """`chaos`: the run it acts on, one fault, the step and the wait."""
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


def _build_args(bd: argparse.ArgumentParser) -> None:
    """`build`: the trainer image from this installation's code, or only its check or cache key."""
    bd.add_argument("--force", action="store_true", help="rebuild the base, the wheelhouse and every layer")
    bd.add_argument("--check", action="store_true", help="build nothing: exit 0 when the image holds this "
                    "installation's code (its code-digest label), 1 when it is missing or holds other code")
    bd.add_argument("--cache-key", action="store_true", help="build nothing: print a key naming this installation's "
                    "image (version, code, Dockerfile, requirements) for a CI cache of `docker save`")


def _plan_args(pl: argparse.ArgumentParser) -> None:
    """`plan`: the planner (train/plan/command.py; torch imported there only)."""
    add_config_args(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (bytes, FLOPs) instead of the table")
    pl.add_argument("--hardware", default=None, metavar="NAME", help="predict the step time on h100-sxm-8x, "
                    "a100-80g-8x, h100-96g, h200 or local (this machine, calibrated once and cached)")
    pl.add_argument("--recalibrate", action="store_true", help="measure the local hardware model again")
    pl.add_argument("--search", action="store_true", help="rank every mesh and schedule of --world-size by "
                    "predicted step time (default --hardware local)")
    pl.add_argument("--world-size", type=int, default=None, metavar="N", help="ranks for --search")
    pl.add_argument("--memory-per-rank", type=float, default=None, metavar="GB",
                    help="mark (search) or warn about (plan) ranks needing more than GB (1e9 bytes)")
    fs = pl.add_argument_group("full size (your program at its real size, nothing computed: launcher/fullsize.py)")
    fs.add_argument("--full-size", action="store_true", help="run your --script/--module (its arguments after --), "
                    "or the built-in trainer by its own flags (--mesh, --model...), "
                    "under torch's FakeTensorMode and fake process group, one host process a rank run; per rank "
                    "peak allocated/reserved memory (CUDA caching allocator model), fits/OOM on --gpu, step time, "
                    "tokens/s")
    fs.add_argument("--ranks", default=None, metavar="R,R|all", help="full size: the ranks to run (default the "
                    "first and the last; each other rank is stood for by the run rank below it)")
    fs.add_argument("--python", default=None, metavar="EXE", help="full size: the interpreter that has your code's "
                    "requirements (default this one), e.g. .venv/bin/python")
    fs.add_argument("--knob", default=None, metavar="NAME=V1,V2", help="full size, with --search: your program's "
                    "own flag --NAME (no dashes here) and the values to try, smallest first (e.g. --knob "
                    "training.local-batch-size=1,2,4); the largest that fits is named")
    fs.add_argument("--trace-dir", default=None, metavar="DIR", help="full size: keep each rank's trace "
                    "(trace-R.json: allocations, frees, ops, collectives) and log (log-R.txt) in DIR")
    add_section(pl, JobOptions, only=FULL_SIZE_JOB, typed=True, title="your program (full size)")


def _project_args(pj: argparse.ArgumentParser) -> None:
    """`project`: a measured run's step on other hardware (train/plan/command.py)."""
    pj.add_argument("run_dir", metavar="RUN_DIR", help="the run folder of the built-in trainer")
    pj.add_argument("--hardware", default="local", metavar="NAME",
                    help="h100-sxm-8x, a100-80g-8x, h100-96g, h200 or local (default local: this machine, calibrated once "
                         "and cached)")
    pj.add_argument("--inter-node-bandwidth", default=None, metavar="RATE",
                    help="the target's network between nodes limited to RATE (tc units, as up's flag: 50mbit); "
                         "no effect where the job's ranks fit one node of the target (8 GPUs on the named ones)")
    pj.add_argument("--recalibrate", action="store_true", help="measure the local hardware model again")
    pj.add_argument("--json", action="store_true", help="print the projection as JSON (seconds)")


def _sweep_args(sp: argparse.ArgumentParser) -> None:
    """`sweep` (launcher/sweep.py): `up`'s job (the trainer's flags, your code's, the node options), then the
    metric and its tolerance (compare's fields, against the job's own layout) and --quiet."""
    add_config_args(sp)
    add_section(sp, JobOptions)
    add_section(sp, CompareOptions, only=SWEEP_COMPARE, typed=True, title="the comparison (against the job's own "
                "layout)")
    add_section(sp, UpOptions, only=COMPARE_RUN)
    add_section(sp, NodeOptions)


def _diagnose_args(dg: argparse.ArgumentParser) -> None:
    dg.add_argument("dir", metavar="DIR", help="the run folder (its flight-recorder/ folder) or the folder of the dumps")


def _compare_args(cp: argparse.ArgumentParser) -> None:
    """`compare`: the request's sections it takes (your code, its node options, the trainer's flags that
    name a layout, a folder, a timeout or an instrument, and --quiet), and its own (layout B, the metric)."""
    add_section(cp, JobOptions)
    add_trainer_args(cp, COMPARE_TRAINER)
    add_section(cp, UpOptions, only=COMPARE_RUN)
    add_section(cp, CompareOptions, typed=True)
    add_section(cp, NodeOptions)


# every command: its help line and what makes its flags (cli.py's COMMANDS runs it)
COMMANDS = {
    "generate": ("write the compose file of a mesh (default compose/mesh-PPxDPxTP.yml)",
                 lambda p: _job_args(p, GenerateOptions)),
    "up": ("run a training job on a fresh cluster, stream its logs, summarise, down", lambda p: _job_args(p, UpOptions)),
    "status": ("table: node, ranks, state, last step", _target_args),
    "logs": ("the cluster's logs (compose logs)", _logs_args),
    "down": ("stop and remove the cluster's containers and network", _target_args),
    "chaos": ("at step N of a run, kill / pause / disconnect one node (fault drills)", _chaos_args),
    "build": ("build the trainer image from this installation's code (images/build.sh, package data when installed: "
              "no checkout needed)", _build_args),
    "report": ("PNG figures and an HTML page of a run folder with metrics.jsonl", _report_args),
    "plan": ("predict per rank memory, traffic per kind and link, and the bubble of a trainer run from its shapes and "
             "schedule; starts nothing (needs torch)", _plan_args),
    "project": ("from a run measured here (--traffic 1 --trace-steps S), the same job's step time on other hardware, "
                "with its parts (needs torch)", _project_args),
    "diagnose": ("a hang on a real cluster: its Flight Recorder dumps (one file a rank, TORCH_NCCL_DEBUG_INFO_TEMP_FILE) "
                 "-> the stall watch's diagnosis", _diagnose_args),
    "compare": ("run your code on layout A, then B; compare a metric step by step (exit 1 beyond --rtol)", _compare_args),
    "sweep": ("run your code or the trainer on its own node layout, on one node and on one rank per node, the mesh the "
              "same; compare a metric step by step (exit 1: differs)", _sweep_args),
}


_NEGATIVE = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)  # a value, not a flag: -1, -1GiB, -.5, -inf, -nan


def fix_negative_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--gpu-memory -1GiB`` -> ``--gpu-memory=-1GiB`` for every flag of ``parser`` (a command's) that takes a
    value, so argparse passes a negative value on to its check, which names it (alone, argparse reads ``-1GiB``
    or ``-inf`` as a flag and says only 'expected one argument')."""
    flags = {s for a in parser._actions if a.option_strings and a.nargs is None for s in a.option_strings}
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


REPEATABLE = (argparse._AppendAction, argparse._CountAction, argparse._HelpAction, argparse._VersionAction)


def given_twice(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first option of ``parser`` (a command's) given more than once in ``argv`` (the launcher's own
    arguments, flags as typed or ``--flag=value``, a prefix argparse takes resolved) that is not repeatable
    (``--env``, ``--mount``... append): ``--nodes: given twice (--nodes 2, --nodes 3)...``; None when none is.
    argparse keeps the last silently: the first would be dropped unsaid."""
    strings = parser._option_string_actions
    seen: dict[argparse.Action, list[str]] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        matches = [strings[flag]] if flag in strings else \
            list({id(a): a for s, a in strings.items() if parser.allow_abbrev and s.startswith(flag)}.values())
        if len(matches) != 1 or isinstance(matches[0], REPEATABLE):
            continue
        action = matches[0]
        shown = token if eq or action.nargs == 0 or i + 1 >= len(argv) else f"{token} {argv[i + 1]}"
        seen.setdefault(action, []).append(shown)
        if len(seen[action]) > 1:
            name = action.option_strings[-1]
            return (f"{name}: given twice ({', '.join(seen[action])}); argparse would keep the last and drop the "
                    f"first unsaid; give it once, e.g. {seen[action][-1]}")
    return None
