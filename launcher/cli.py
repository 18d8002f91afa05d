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
from dataclasses import fields
from typing import Callable
import re
import shlex
import sys
import tempfile

from launcher.compose import (NodeOptions, RDZV_BACKENDS, build_compose, default_compose_path, default_run_dir,
                              render_yaml)
from launcher.dockercli import ROOT, LauncherError
from train.cli import add_config_args, config_from_args
from train.config import Config, ConfigError, MeshSpec
from train.preflight import preflight

EXIT_USAGE = 2


def repo_path(path: str, root: str = ROOT) -> str:
    """A user path (relative to the cwd) as the repo-relative POSIX path when inside the repo,
    else absolute."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full, root)
    inside = rel != ".." and not rel.startswith(".." + os.sep) and not os.path.isabs(rel)
    return rel.replace(os.sep, "/") if inside else full


def project_dir_for(out_path: str, root: str = ROOT) -> str:
    """Path from the folder of out_path to the repo root: "." , "..", "../.." or absolute."""
    folder = os.path.dirname(os.path.abspath(out_path))
    if repo_path(folder, root).startswith("/"):
        return root
    return os.path.relpath(root, folder).replace(os.sep, "/")


def write_atomic(path: str, text: str) -> None:
    """Write text to path via a temp file in the same folder + os.replace (no partial files)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """Container options of every node (see launcher.compose.NodeOptions)."""
    g = parser.add_argument_group("node options")
    g.add_argument("--cpus-per-node", type=float, default=None, help="CPU limit per node container (default: none)")
    g.add_argument("--memory-per-node", default=None, help="memory limit per node container, e.g. 3g (default: none)")
    g.add_argument("--image", default=NodeOptions.image, help=f"trainer image (default {NodeOptions.image})")
    g.add_argument("--rdzv-backend", choices=RDZV_BACKENDS, default=NodeOptions.rdzv_backend,
                   help="torchrun rendezvous backend (default c10d; see launcher/node.py)")
    g.add_argument("--module", default=NodeOptions.module,
                   help="module torchrun runs (default train; launcher.probe tests the wiring)")
    g.add_argument("--mount-code", action="store_true",
                   help="bind-mount this checkout's train/ and launcher/ over /app (no image rebuild)")
    g.add_argument("--join-timeout-s", type=float, default=None, metavar="S",
                   help="every node must join the rendezvous within S seconds of its start, else the job "
                        "ends naming the missing node (default 300)")
    g.add_argument("--torchrun", action="store_true",
                   help="start the ranks with stock torchrun, a fresh interpreter each (default: torchrun's "
                        "agent forking them after one import per node, ~10 s faster on 2 cores)")


def node_options(args: argparse.Namespace) -> NodeOptions:
    return NodeOptions(cpus_per_node=args.cpus_per_node, memory_per_node=args.memory_per_node, image=args.image,
                       rdzv_backend=args.rdzv_backend, module=args.module, mount_code=args.mount_code,
                       join_timeout_s=args.join_timeout_s, torchrun=args.torchrun)


def prepare(args: argparse.Namespace, run_default: Callable[[MeshSpec], str] = default_run_dir
            ) -> tuple[Config, NodeOptions]:
    """Config + NodeOptions from the flags, preflighted, with paths made repo-relative.
    run_default(mesh) names the run folder when neither --run-dir nor --config sets one.

    Raises:
        ConfigError: bad mesh, failed preflight, bad node options.
    """
    cfg = config_from_args(args)
    if cfg.data is not None:
        cfg = dataclasses.replace(cfg, data=os.path.abspath(cfg.data))
    preflight(cfg)  # data paths checked as the user gave them (cwd-relative)
    cfg = dataclasses.replace(cfg, mesh=str(cfg.mesh_spec()))
    if cfg.run_dir == Config().run_dir:
        cfg = dataclasses.replace(cfg, run_dir=run_default(cfg.mesh_spec()))
    cfg = dataclasses.replace(cfg, run_dir=repo_path(cfg.run_dir),
                              data=repo_path(cfg.data) if cfg.data is not None else None)
    node = node_options(args)
    build_compose(cfg, node, ".")  # raises on bad node options
    return cfg, node


def regenerate_command(cfg: Config, node: NodeOptions, out: str | None) -> str:
    """The canonical ``python -m launcher generate`` line for this cfg/node (and --out)."""
    parts = ["python -m launcher generate", "--mesh", cfg.mesh]
    defaults = Config()
    for f in fields(Config):
        value = getattr(cfg, f.name)
        if f.name == "mesh" or value is None or value == getattr(defaults, f.name):
            continue
        if f.name == "run_dir" and value == default_run_dir(cfg.mesh_spec()):
            continue
        parts += ["--" + f.name.replace("_", "-"), shlex.quote(str(value))]
    for f in fields(NodeOptions):
        value = getattr(node, f.name)
        if value != f.default and f.name != "rdzv_port":
            flag = "--" + f.name.replace("_", "-")
            parts += [flag] if value is True else [flag, shlex.quote(str(value))]
    if out is not None:
        parts += ["--out", shlex.quote(out)]
    return " ".join(parts)


def compose_text(cfg: Config, node: NodeOptions, out_path: str) -> str:
    """The YAML of cfg/node for a compose file written at out_path."""
    out_rel = repo_path(out_path)
    shown = None if out_rel == default_compose_path(cfg.mesh_spec()) else out_rel
    doc = build_compose(cfg, node, project_dir_for(out_path))
    return render_yaml(doc, regenerate_command(cfg, node, shown), compose_file=out_rel, run_dir=cfg.run_dir)


def cmd_generate(args: argparse.Namespace) -> int:
    cfg, node = prepare(args)
    out = args.out or os.path.join(ROOT, default_compose_path(cfg.mesh_spec()))
    text = compose_text(cfg, node, out)
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(fix_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "generate":
            return cmd_generate(args)
        from launcher import runner  # subprocess/Docker side

        if args.command == "up":
            cfg, node = prepare(args, run_default=runner.default_run_dir_up)
            if args.max_restarts < 0:
                raise ConfigError(f"--max-restarts: must be >= 0, got {args.max_restarts}")
            return runner.up(cfg, node, compose_text, build=args.build, keep=args.keep, quiet=args.quiet,
                             progress_every=args.progress_every, max_restarts=args.max_restarts,
                             start_late=parse_start_late(args.start_late))
        if args.command == "chaos":
            from launcher.chaos import chaos

            kind = "kill" if args.kill else "pause" if args.pause else "disconnect"
            return chaos(kind, args.kill or args.pause or args.disconnect, args.at_step, args.run_dir, args.file,
                         args.project, wait_s=args.wait_s)
        target = runner.Target.find(args.run_dir, args.file, args.project)
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
