"""Command line of the launcher: generate | up | down | status | logs | chaos | report | build | compare | sweep | plan | project | diagnose.

    python -m launcher generate --mesh 2x2x2 [--target compose|swarm|slurm|jobset|trainjob|skypilot] [--out FILE] [--stdout] ...
    python -m launcher up --mesh 2x2x2 --model tiny --steps 50 [--run-dir DIR] [--build] [--keep]
    python -m launcher up --target swarm|slurm --mesh 2x2x2 --model tiny --steps 3
    python -m launcher status [--run-dir DIR | --file FILE]
    python -m launcher logs [--follow] [--tail N] [SERVICE ...]
    python -m launcher down [--run-dir DIR | --file FILE]
    python -m launcher chaos (--kill | --pause | --disconnect) NODE --at-step N [--run-dir DIR | --file FILE]
    python -m launcher chaos (--kill-host | --disconnect-host) HOST --at-step N [--run-dir DIR]
    python -m launcher report [--run-dir DIR]     # PNGs + one HTML page of a run (default: the newest)
    python -m launcher build [--force]             # the trainer image, from this installation's code
    python -m launcher compare --script FILE --mesh 2x2x2 --against 2x2x1 [--metric loss] [--rtol 1e-5] -- ARGS
    python -m launcher sweep --script FILE --nodes 2 --nproc-per-node 2 [--metric loss] [--rtol 1e-5] -- ARGS
    python -m launcher plan --mesh 2x2x2 --model small [--schedule 1f1b] [--microbatches N] [--hardware NAME] [--json]
    python -m launcher plan --search --world-size 8 --model small [--hardware local] [--memory-per-rank GB]
    python -m launcher plan --full-size --script FILE --nodes N --nproc-per-node M --gpu h100-96g [--json] -- ARGS
    python -m launcher project RUN_DIR --hardware h100-sxm-8x [--inter-node-bandwidth 50mbit] [--json]
    python -m launcher diagnose DIR                # a hang's Flight Recorder dumps (DIR/flight-recorder) named

Installed with pip, the same commands are `simcluster ...` or `python -m simcluster ...`.

Exit codes: 0 ok; 1 the run failed (a node exited non-zero, Docker error; compare, sweep: the runs differ); 2 bad options
(mesh, preflight, node options), with the reason on stderr and no file written.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from simcluster.launcher.job.checks import out_problem
from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.job.files import ROOT, container_user, repo_path, write_atomic
from simcluster.launcher.container.layout import IMAGE_USER
from simcluster.launcher.parser import build_parser as _build_parser, fix_negative_values, given_twice
from simcluster.launcher.parser_hints import unknown_hint
from simcluster.launcher.job.options import resolve, split_job_argv
from simcluster.launcher.job.request import cli_values, request_from_cli
from simcluster.core.config import Config
from simcluster.core.errors import ConfigError

EXIT_USAGE = 2


def cmd_generate(args: argparse.Namespace) -> int:
    """`generate`: the engine's document (engines/registry.py ENGINES[--target]), written or printed."""
    from simcluster.launcher.engines.deps_image import with_image
    from simcluster.launcher.engines.document import GENERATED
    from simcluster.launcher.engines.registry import engine_named

    req = request_from_cli(vars(args))
    engine = engine_named(req.target)
    launch, command = resolve(req, user=IMAGE_USER)
    engine.check(launch)
    out = req.out or os.path.join(ROOT, engine.out_path(launch.job_name))
    if not req.stdout and (why := out_problem(out, GENERATED)):
        raise ConfigError(f"out: {why}; e.g. --out {engine.out_path(launch.job_name)}")
    if launch.engine.push:  # the registry answers before any image is built, tagged or pushed
        from simcluster.launcher.engines.push import check_registry
        check_registry(launch.engine.push)
    if launch.requirements:  # its derived image, after every check: the document names it
        launch = with_image(launch, say=lambda line: print(line, file=sys.stderr))
    if launch.engine.push:  # --push: the document names the pushed image
        from simcluster.launcher.engines.push import with_pushed
        launch = with_pushed(launch, say=lambda line: print(line, file=sys.stderr))
    for warning in engine.warnings(launch):
        print(f"warning: {warning}", file=sys.stderr)
    text = engine.render(launch, command, repo_path(out), engine.project_dir(launch, out))
    if req.stdout:
        sys.stdout.write(text)
    else:
        try:
            write_atomic(out, text)
        except OSError as e:
            raise ConfigError(f"out: {out} cannot be written ({e.strerror}); e.g. --out "
                              f"{engine.out_path(launch.job_name)}") from None
        print(os.path.relpath(out) if not repo_path(out).startswith("/") else out)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """`up`: the flags mapped onto the one JobRequest (job/request.py), then the Python API's one run
    (launcher/api.py up), printing as it goes; its exit code.

    Raises:
        ConfigError: a bad option (exit 2).
    """
    from simcluster.launcher.api import up

    return up(request_from_cli(vars(args)))[1]


def cmd_build(args: argparse.Namespace) -> int:
    """Build the image; --check: 0 when it holds this installation's code, else 1; --cache-key: print its key."""
    from simcluster.launcher.container.layout import IMAGE
    from simcluster.launcher.engines.image import build_image, cache_key, image_state

    if args.check and args.cache_key:
        raise ConfigError("build: --check or --cache-key, not both; e.g. simcluster build --check")
    if args.force and (args.check or args.cache_key):
        raise ConfigError(f"force: --force rebuilds, but --{'check' if args.check else 'cache-key'} builds nothing; "
                          f"drop one, e.g. simcluster build --force")
    if args.cache_key:
        print(cache_key())
        return 0
    if args.check:
        ok, line = image_state(IMAGE)
        print(f"image: {line}")
        return 0 if ok else 1
    build_image(force=args.force)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from simcluster.launcher.observe.report import cmd_report as report

    return report(args.run_dir, ROOT, args.metric_regex)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """`diagnose DIR`: the stall watch's lines from one job's Flight Recorder dumps (train/flightrec.py)."""
    from simcluster.train.flightrec import diagnose_folder

    for line in diagnose_folder(args.dir):
        print(line)
    return 0


def cmd_chaos(args: argparse.Namespace) -> int:
    from simcluster.launcher.drills.chaos import chaos
    from simcluster.launcher.drills.chaos_checks import FAULTS
    from simcluster.launcher.drills.host_chaos import HOST_FAULTS, chaos_host
    from simcluster.launcher.engines.registry import ENGINES

    if host_kind := next((k for k in HOST_FAULTS if getattr(args, k.replace("-", "_")) is not None), None):
        if args.file or args.project:
            raise ConfigError(f"--{host_kind}: acts on a run folder (--run-dir), not on --file/--project")
        return chaos_host(host_kind, getattr(args, host_kind.replace("-", "_")), args.at_step, args.run_dir,
                          wait_s=args.wait_s, engines=tuple(ENGINES.values()))
    kind = next(k for k in FAULTS if getattr(args, k) is not None)
    return chaos(kind, str(getattr(args, kind)), args.at_step, args.run_dir, args.file, args.project, wait_s=args.wait_s,
                 engines=tuple(ENGINES.values()))


def cmd_compare(args: argparse.Namespace) -> int:
    """Two runs and the table (launcher/compare.py; the flags are its keywords, typed by job/request.py);
    0 within --rtol, 1 beyond it or a run failed.

    Raises:
        ConfigError: a bad option (exit 2).
    """
    from simcluster.launcher.compare import compare, result_text

    values = cli_values(vars(args))  # the request's names: compare takes them as they are
    values.pop("command")
    result = compare(**values)
    print(result_text(result), flush=True)
    return 0 if result.ok else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    """The layout sweep and its table (launcher/sweep.py; `up`'s flags make its one JobRequest);
    0 when every layout agrees, 1 when one differs or failed.

    Raises:
        ConfigError: a bad option (exit 2).
    """
    from simcluster.launcher.sweep import result_text, sweep_request

    own = {k: getattr(args, k) for k in ("metric", "metric_regex", "rtol", "quiet")}
    request = request_from_cli({**{k: v for k, v in vars(args).items() if k not in own}, "command": "up"})
    result = sweep_request(request, **own)
    print(result_text(result), flush=True)
    return 0 if result.ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    """The trainer's run, preflighted as `up` would, planned from its shapes (train/plan; torch is
    imported there only); with --full-size, your program run at its real size (launcher/fullsize.py)."""
    full = ("script", "module", "code", "nodes", "nproc_per_node", "gpu", "requirements", "env", "ranks", "python",
            "knob", "trace_dir")
    if args.full_size:
        from simcluster.launcher.fullsize import run as full_size

        trainer = {f.name for f in fields(Config)} | {"config"}  # the built-in trainer's: launcher/fullsize.py reads them
        unread = [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if v not in (None, False)
                  and k not in (*full, *trainer, "command", "json", "search", "full_size", "job_argv")]
        if unread:
            raise ConfigError(f"plan --full-size: {', '.join(unread)} set the analytic plan (plan without --full-size) "
                              f"and are not read here; drop them, e.g. python -m launcher plan --full-size --script "
                              f"train.py --nodes 1 --nproc-per-node 8 --gpu h100-96g -- ARGS")
        return full_size(args)
    only_full = [f"--{k.replace('_', '-')}" for k in full if getattr(args, k, None)]
    if only_full or args.job_argv:
        raise ConfigError(f"plan: {', '.join(only_full or ['arguments after --'])} read by --full-size only; add "
                          f"--full-size, e.g. python -m launcher plan --full-size --script train.py --nodes 1 "
                          f"--nproc-per-node 8 --gpu h100-96g -- ARGS")
    try:
        from simcluster.train.plan.command import run
    except ImportError as e:
        raise ConfigError(f"plan: needs torch ({e}); pip install 'simcluster[torch]'") from None
    return run(args)


def cmd_project(args: argparse.Namespace) -> int:
    """A measured run's step time on other hardware (train/plan/project.py; torch is imported there only)."""
    try:
        from simcluster.train.plan.command import project
    except ImportError as e:
        raise ConfigError(f"project: needs torch ({e}); pip install 'simcluster[torch]'") from None
    return project(args)


def cmd_status(args: argparse.Namespace) -> int:
    """`status`: the run's engine (the one that owns its handle) prints its nodes and how it ended."""
    handle, engine = _run_of(args)
    return engine.status(handle)


def cmd_logs(args: argparse.Namespace) -> int:
    """`logs`: the run's engine prints its logs (--tail as Compose and the Docker API take it: all or a count)."""
    if args.tail != "all" and not (args.tail.isascii() and args.tail.isdigit()):
        raise ConfigError(f"--tail: {args.tail!r} is not 'all' or a number of lines (0 or more); e.g. --tail 100")
    handle, engine = _run_of(args)
    return engine.logs(handle, args.services, follow=args.follow, tail=args.tail)


def cmd_down(args: argparse.Namespace) -> int:
    """`down`: the run's engine removes its containers and network."""
    handle, engine = _run_of(args)
    return engine.down(handle)


def _run_of(args: argparse.Namespace):
    """(the handle of --run-dir/--file/--project, the engine that owns it: engines/registry.py engine_of)."""
    from simcluster.launcher.docker.handle import Handle
    from simcluster.launcher.engines.registry import engine_of

    handle = Handle.find(args.run_dir, args.file, args.project)
    return handle, engine_of(handle)


COMMANDS = {"generate": cmd_generate, "up": cmd_up, "build": cmd_build, "report": cmd_report, "chaos": cmd_chaos,
            "status": cmd_status, "logs": cmd_logs, "down": cmd_down, "compare": cmd_compare,
            "sweep": cmd_sweep, "plan": cmd_plan, "project": cmd_project, "diagnose": cmd_diagnose}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The launcher's parser with this module's help text (launcher/parser.py); only: that command's
    flags alone (the command line's), None: every command's."""
    return _build_parser(__doc__, only)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run its command; the exit code (2: bad options, ConfigError's
    message on stderr; argparse's own usage errors exit 2 through SystemExit)."""
    own, job_argv = split_job_argv(sys.argv[1:] if argv is None else argv)
    command = next((a for a in own if not a.startswith("-")), None)  # the top level takes no option but --help
    parser = build_parser(command if command in COMMANDS else None)
    args, unknown = parser.parse_known_args(fix_negative_values(own, parser.commands[command]) if command in COMMANDS
                                            else own)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    if twice := given_twice(sub, own):
        sub.error(twice)  # the command's own usage line, exit 2
    if unknown:
        yours = bool(getattr(args, "script", None) or getattr(args, "module", None))
        hint = unknown_hint(build_parser(), args.command, unknown, yours)  # every command's flags: the error path only
        sub.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")  # the command's own usage line
    args.job_argv = job_argv
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed by its reader (`| head`); the engine removed its cluster first
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit fails no more
        return 1
