"""Command line of the launcher: generate | up | down | status | logs | chaos.

    python -m launcher generate --mesh 2x2x2 [--out FILE] [--stdout] [training options] [node options]
    python -m launcher up --mesh 2x2x2 --model tiny --steps 50 [--run-dir DIR] [--build] [--keep]
    python -m launcher status [--run-dir DIR | --file FILE]
    python -m launcher logs [--follow] [--tail N] [SERVICE ...]
    python -m launcher down [--run-dir DIR | --file FILE]
    python -m launcher chaos (--kill | --pause | --disconnect) NODE --at-step N [--run-dir DIR | --file FILE]

Exit codes: 0 ok; 1 the run failed (a node exited non-zero, Docker error); 2 bad options
(mesh, preflight, node options), with the reason on stderr and no file written.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
from dataclasses import fields

from launcher.compose import default_compose_path, render
from launcher.engine import LauncherError
from launcher.files import ROOT, container_user, project_dir_for, repo_path, write_atomic
from launcher.launch import RDZV_BACKENDS, Launch, NodeOptions, resolve_training
from launcher.layout import JOIN_TIMEOUT_S
from train.cli import add_config_args, config_from_args
from train.config import Config, ConfigError

EXIT_USAGE = 2


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """Container options of every node (see launcher.launch.NodeOptions)."""
    g = parser.add_argument_group("node options")
    g.add_argument("--cpus-per-node", type=float, default=None, help="CPU limit per node container (default: none)")
    g.add_argument("--memory-per-node", default=None, help="memory limit per node container, e.g. 3g (default: none)")
    g.add_argument("--image", default=NodeOptions.image, help=f"trainer image (default {NodeOptions.image})")
    g.add_argument("--rdzv-backend", choices=RDZV_BACKENDS, default=NodeOptions.rdzv_backend,
                   help="torchrun rendezvous backend (default c10d; see launcher/container/node.py)")
    g.add_argument("--module", default="train",
                   help="module torchrun runs (default train; launcher.container.probe tests the wiring)")
    g.add_argument("--mount-code", action="store_true",
                   help="bind-mount this checkout's train/ and launcher/ over /app (no image rebuild)")
    g.add_argument("--join-timeout-s", type=float, default=JOIN_TIMEOUT_S, metavar="S",
                   help=f"every node must join the rendezvous within S seconds of its start, else the job "
                        f"ends naming the missing node (default {JOIN_TIMEOUT_S:g})")
    g.add_argument("--torchrun", action="store_true",
                   help="start the ranks with stock torchrun, a fresh interpreter each (default: torchrun's "
                        "agent forking them after one import per node, ~10 s faster on 2 cores)")
    g.add_argument("--user", default=None, metavar="UID:GID",
                   help="user the containers run as (generate: 1000:1000, the image's; up: yours, or 1000:1000 "
                        "when run as root)")


def resolve(args: argparse.Namespace, user: str) -> tuple[Launch, str]:
    """The edge: flags -> (Launch, the canonical ``launcher generate`` line of these options).
    Paths the user typed are taken relative to the cwd and named repo-relative when inside the
    repo, else absolute. One preflight, one mesh parse.

    Raises:
        ConfigError: a bad mesh, config field, data path or node option.
    """
    cfg = config_from_args(args)
    paths = {k: os.path.abspath(getattr(cfg, k)) for k in ("data", "run_dir") if getattr(cfg, k) is not None}
    cfg = dataclasses.replace(cfg, **paths)
    node = NodeOptions(cpus_per_node=args.cpus_per_node, memory_per_node=args.memory_per_node, image=args.image,
                       rdzv_backend=args.rdzv_backend, mount_code=args.mount_code,
                       join_timeout_s=args.join_timeout_s, torchrun=args.torchrun, user=args.user or user)
    launch = resolve_training(cfg, node, module=args.module, host_path=repo_path)
    return launch, generate_command(cfg, args, launch)


def generate_command(cfg: Config, args: argparse.Namespace, launch: Launch) -> str:
    """``python -m launcher generate`` with every option the user set (paths as the compose
    file names them), in a fixed order: the header line of a generated file."""
    parts = ["python -m launcher generate"]
    defaults = Config()
    for f in fields(Config):
        value = getattr(cfg, f.name)
        if value is not None and value != getattr(defaults, f.name) or f.name == "mesh":
            value = repo_path(value) if f.name in ("data", "run_dir") else launch.mesh if f.name == "mesh" else value
            parts += ["--" + f.name.replace("_", "-"), shlex.quote(str(value))]
    node_defaults = {"cpus_per_node": None, "memory_per_node": None, "image": NodeOptions.image,
                     "rdzv_backend": NodeOptions.rdzv_backend, "module": "train", "mount_code": False,
                     "join_timeout_s": JOIN_TIMEOUT_S, "torchrun": False, "user": None}
    for name, default in node_defaults.items():
        value = getattr(args, name)
        if value != default:
            flag = "--" + name.replace("_", "-")
            parts += [flag] if value is True else [flag, shlex.quote(str(value))]
    if getattr(args, "out", None) is not None:
        parts += ["--out", shlex.quote(repo_path(args.out))]
    return " ".join(parts)


def cmd_generate(args: argparse.Namespace) -> int:
    launch, command = resolve(args, user=NodeOptions.user)
    out = args.out or os.path.join(ROOT, default_compose_path(launch))
    text = render(launch, repo_path(out), project_dir_for(out), command)
    if args.stdout:
        sys.stdout.write(text)
    else:
        write_atomic(out, text)
        print(os.path.relpath(out) if not repo_path(out).startswith("/") else out)
    return 0


def _target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default=None, help="run folder of an `up` run (default: the newest under runs/)")
    p.add_argument("--file", "-f", dest="file", default=None, help="a compose file instead (e.g. docker-compose.yml)")
    p.add_argument("--project", "-p", default=None, help="compose project name (default: from the run or the file's folder)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the compose file of a mesh (default compose/mesh-PPxDPxTP.yml)")
    gen.add_argument("--out", default=None, help="output file (default compose/mesh-PPxDPxTP.yml in the repo)")
    gen.add_argument("--stdout", action="store_true", help="print the YAML that would go to --out; write nothing")
    add_config_args(gen)
    add_node_args(gen)
    up = sub.add_parser("up", help="run a training job on a fresh cluster, stream its logs, summarise, down")
    add_config_args(up)
    add_node_args(up)
    up.add_argument("--build", action="store_true", help="run images/build.sh even if the image exists")
    up.add_argument("--keep", action="store_true", help="leave the stopped containers (no `down` at the end)")
    up.add_argument("--quiet", action="store_true", help="hide per-step lines; show progress lines instead")
    up.add_argument("--progress-every", type=float, default=10.0, metavar="S", help="seconds between progress lines")
    up.add_argument("--max-restarts", type=int, default=0, metavar="N",
                    help="after a failure restart the whole cluster up to N times, resuming from the run's newest "
                         "checkpoint (use with --ckpt-every; default 0)")
    up.add_argument("--start-late", action="append", default=[], metavar="NODE=S",
                    help="start NODE's container S seconds after the others (late-join drill; repeatable)")
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
    fault.add_argument("--pause", metavar="NODE", help="docker pause (freeze) the node's container")
    fault.add_argument("--disconnect", metavar="NODE", help="docker network disconnect the node's container")
    ch.add_argument("--at-step", type=int, default=1, metavar="N", help="wait until the run reached step N (default 1)")
    ch.add_argument("--wait-s", type=float, default=3600.0, metavar="S", help="give up after S seconds (default 3600)")
    return parser


def parse_start_late(values: list[str]) -> dict[str, float]:
    """``["node-1=20"]`` -> {"node-1": 20.0}.

    Raises:
        ConfigError: not NODE=SECONDS with SECONDS >= 0.
    """
    out = {}
    for v in values:
        name, _, sec = v.partition("=")
        try:
            out[name] = float(sec)
        except ValueError:
            raise ConfigError(f"--start-late {v!r}: expected NODE=SECONDS, e.g. node-1=20") from None
        if not name or out[name] < 0:
            raise ConfigError(f"--start-late {v!r}: expected NODE=SECONDS, e.g. node-1=20")
    return out


def fix_negative_values(argv: list[str], flags: tuple[str, ...] = ("--mesh",)) -> list[str]:
    """``--mesh -1x2x2`` -> ``--mesh=-1x2x2`` so argparse passes it on (to fail in parse_mesh)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def cmd_up(args: argparse.Namespace) -> int:
    from launcher import runner  # Docker side

    launch, command = resolve(args, user=container_user())
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts: must be >= 0, got {args.max_restarts}")
    start_late = parse_start_late(args.start_late)
    unknown = sorted(set(start_late) - set(launch.names))
    if unknown:
        raise ConfigError(f"--start-late: no node {', '.join(unknown)} in {launch.shape}; nodes are "
                          f"{', '.join(launch.names)}")
    return runner.up(launch, command, build=args.build, keep=args.keep, quiet=args.quiet,
                     progress_every=args.progress_every, max_restarts=args.max_restarts, start_late=start_late)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(fix_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "up":
            return cmd_up(args)
        from launcher import runner
        from launcher.target import Target

        if args.command == "chaos":
            from launcher.chaos import chaos

            kind = "kill" if args.kill else "pause" if args.pause else "disconnect"
            return chaos(kind, args.kill or args.pause or args.disconnect, args.at_step, args.run_dir, args.file,
                         args.project, wait_s=args.wait_s)
        target = Target.find(args.run_dir, args.file, args.project)
        if args.command == "status":
            return runner.status(target)
        if args.command == "logs":
            return runner.logs(target, args.services, follow=args.follow, tail=args.tail)
        return runner.down(target)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
