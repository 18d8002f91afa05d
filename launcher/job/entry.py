"""The two kinds of job, one path to a Launch: the built-in trainer, or the user's own torchrun code.

    python -c "from simcluster.launcher.job.entry import resolve_code; from simcluster.launcher.job.launch import NodeOptions; \
print(resolve_code(NodeOptions(), script='examples/ddp.py', nodes=2, nproc_per_node=2))"

``resolve_training``: a trainer Config (preflighted: the one mesh parse) -> a Launch running
``-m train`` with the Config's flags, ranks forked by the node agent after one import.
``resolve_code``: a script (``--script FILE``) or a module (``--module M``, from ``--code DIR``
or from the image) with its own arguments, on a mesh (``--mesh``: nodes = pp, ranks per node
= dp*tp, SIMCLUSTER_PP/DP/TP set) or on ``--nodes N --nproc-per-node M``; it starts the way
stock torchrun starts it, each rank forked after one import of torch per node. The user's code
folder is mounted read-only at /code, the ranks' working directory, first on sys.path, with the
image's own code (/app) after it.
Both check every input before anything exists and raise ConfigError naming the field and a fix.
"""
from __future__ import annotations

import dataclasses
import math
import os
import posixpath
import re
from dataclasses import fields

from simcluster.launcher.job.launch import Launch, Mount, NodeOptions, check_node_options
from simcluster.launcher.container.layout import APP_DIR, CODE_DIR, DATA_MOUNT, RUNS_MOUNT
from simcluster.launcher.job.files import run_name
from simcluster.core.layout import TRAINER_MODULE
from simcluster.core.config import Config, MeshSpec, parse_mesh
from simcluster.core.errors import ConfigError
from simcluster.core.paths import unresolved
from simcluster.train.preflight import preflight

RESERVED = (RUNS_MOUNT, APP_DIR, CODE_DIR, "/tmp")  # mount targets the launcher owns
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _flag_value(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def train_flags(cfg: Config, mesh: MeshSpec, run: str, data: str | None) -> tuple[str, ...]:
    """The ``-m train`` flags inside a node: every Config field the user set (not None, not its
    default), with --mesh normalised, --run-dir /runs/<run> and --data /data/<name>; sorted by
    flag name, so the output is deterministic."""
    defaults = Config()
    values = {f.name: _flag_value(getattr(cfg, f.name)) for f in fields(Config)
              if getattr(cfg, f.name) is not None and getattr(cfg, f.name) != getattr(defaults, f.name)}
    values.update(mesh=str(mesh), run_dir=f"{RUNS_MOUNT}/{run}")
    if data is not None:
        values["data"] = f"{DATA_MOUNT}/{run_name(data)}"
    return tuple(x for name in sorted(values) for x in ("--" + name.replace("_", "-"), values[name]))


def _reserved(dst: str) -> bool:
    """A mount target the launcher owns (RESERVED) or one inside it."""
    return any(dst == r or dst.startswith(r + "/") for r in RESERVED)


def parse_mount(text: str) -> tuple[str, str, str]:
    """``SRC:DST[:ro|rw]`` -> (SRC, DST, mode); mode defaults to ro.

    Raises:
        ConfigError: not of that form, or DST not an absolute path as Docker cleans it (no '..', '.', '//', or a
            trailing '/').
    """
    parts = text.split(":")
    mode = parts.pop() if len(parts) == 3 else "ro"
    if len(parts) != 2 or not all(parts) or mode not in ("ro", "rw") or not parts[1].startswith("/"):
        raise ConfigError(f"mount: {text!r} is not SRC:DST[:ro|rw] with an absolute DST; "
                          f"e.g. --mount ./corpus:/data/corpus:ro")
    clean = "/" + posixpath.normpath(parts[1]).lstrip("/")
    if clean != parts[1]:  # Docker cleans DST: /data/../app would land on the launcher's /app, unchecked
        mine = f"/data/{os.path.basename(parts[0].rstrip('/')) or 'x'}"
        fix = f"a target of yours, e.g. --mount {parts[0]}:{mine}:{mode} ({clean} is the launcher's)" \
            if _reserved(clean) else f"that, e.g. --mount {parts[0]}:{clean}:{mode}"
        raise ConfigError(f"mount: {text!r}: DST {parts[1]!r} is not a plain path, and Docker mounts it at {clean!r}; "
                          f"write {fix}")
    return parts[0], parts[1], mode


def _mounts(specs: tuple[str, ...], host_path, user: str, errors: list[str]) -> list[Mount]:
    """Mounts of --mount SRC:DST[:MODE] (SRC relative to the cwd), each SRC checked to exist."""
    out: list[Mount] = []
    for spec in specs:
        try:
            src, dst, mode = parse_mount(spec)
        except ConfigError as e:
            errors.append(str(e))
            continue
        src = os.path.abspath(src)
        if not os.path.exists(src):
            what = f"is {loose}" if (loose := unresolved(src)) else "does not exist"
            errors.append(f"mount: source {src} {what}; create it or fix --mount {spec}")
        elif why := unreadable(src, user):
            errors.append(f"mount: {why}")
        elif _reserved(dst) or dst in {m.target for m in out}:
            errors.append(f"mount: target {dst} is taken ({', '.join(RESERVED)} are the launcher's, each target "
                          f"once); pick another, e.g. /data/{os.path.basename(src)}")
        else:
            out.append(Mount(host_path(src), dst, mode))
    return out


def unreadable(path: str, user: str) -> str | None:
    """Why a bind-mount source cannot be read by the containers' user ``UID:GID`` (a folder also
    needs x), else None. Only the mount's own top is checked: inside it, the files' modes rule.
    A user that is not UID:GID is check_node_options' to report, not this check's."""
    if not re.fullmatch(r"\d+:\d+", user):
        return None
    st = os.stat(path)
    uid, gid = (int(x) for x in user.split(":"))
    need = 0o5 if os.path.isdir(path) else 0o4
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    if uid == 0 or (st.st_mode >> shift) & need == need:
        return None
    return (f"{path} is not readable by the containers' user {user} (owner {st.st_uid}:{st.st_gid}, mode "
            f"{oct(st.st_mode & 0o777)}); chmod o+r{'x' if need == 0o5 else ''} {path}, or pass --user")


def _finish(errors: list[str], node: NodeOptions, run_dir: str) -> None:
    """The checks every job shares; raises ConfigError listing every problem."""
    errors += check_node_options(node)
    if not run_name(run_dir):
        errors.append(f"run_dir: {run_dir!r} has no folder name; pass e.g. --run-dir runs/mesh-2x2x2")
    if errors:
        raise ConfigError("\n  ".join(["invalid launch:", *errors]))


def resolve_training(cfg: Config, node: NodeOptions, mounts: tuple[str, ...] = (), host_path=lambda p: p) -> Launch:
    """The Launch of the built-in trainer: preflight (the one mesh parse), run folder, mounts, flags.

    cfg: the user's options; its run_dir and data as host_path(p) will name them in the compose
        file (the CLI passes a function giving repo-relative or absolute paths). An unset run_dir
        is the one default rule of simcluster.core.config.default_run_dir, relative to the repo root.

    Raises:
        ConfigError: every problem of the config (preflight), the node options, mounts or run folder.
    """
    run = preflight(cfg)
    errors: list[str] = []
    extra = _mounts(mounts, host_path, node.user, errors)
    run_dir = host_path(cfg.run_dir) if cfg.run_dir is not None else run.config.run_dir
    _finish(errors, node, run_dir)
    data = host_path(cfg.data) if cfg.data is not None else None
    data_mounts = [Mount(data, f"{DATA_MOUNT}/{run_name(data)}")] if data is not None else []
    return Launch(nnodes=run.mesh.pp, nproc_per_node=run.mesh.ranks_per_node, mesh=run.mesh, module=TRAINER_MODULE,
                  script=None, argv=train_flags(cfg, run.mesh, run_name(run_dir), data), run_dir=run_dir,
                  mounts=(*data_mounts, *extra), timeout_s=float(run.config.timeout_s), node=node,
                  train=run)


def _module_file(code: str, module: str) -> str | None:
    """The file of module under folder code (a .py, a package's __init__.py), else None."""
    base = os.path.join(code, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _shape(mesh: str | None, nodes: int | None, nproc_per_node: int | None, errors: list[str]) -> tuple:
    """(MeshSpec or None, nodes, ranks per node): a mesh's (it wins), else nodes x ranks as given; a
    problem appended to errors."""
    spec = None
    if mesh is not None:  # the request refused a mesh given with nodes x ranks (job/request.py)
        try:
            spec = parse_mesh(mesh)
            nodes, nproc_per_node = spec.pp, spec.ranks_per_node
        except ConfigError as e:
            errors.append(str(e))
    elif nodes is None or nproc_per_node is None or nodes < 1 or nproc_per_node < 1:
        errors.append(f"shape: --nodes and --nproc-per-node must both be >= 1 (got {nodes}, {nproc_per_node}); "
                      f"e.g. --nodes 2 --nproc-per-node 2, or --mesh 2x2x2")
    return spec, nodes, nproc_per_node


def _code_target(script: str | None, module: str | None, code: str | None, installs: bool,
                 errors: list[str]) -> tuple[str | None, str | None]:
    """(the code folder mounted at CODE_DIR or None, the script's path in the nodes or None): the code folder
    (--code, else the script's folder), the script inside it, the module in it (unless installs); problems
    appended to errors."""
    code_dir = os.path.abspath(code) if code is not None else None
    if code_dir is not None and not os.path.isdir(code_dir):
        errors.append(f"code: {code_dir} is not a folder; pass the folder that holds your code with --code")
        code_dir = None
    target_script = None
    if script is not None:
        path = os.path.abspath(script)  # an existing file: the request checked it (job/request.py)
        code_dir = code_dir or os.path.dirname(path)
        rel = os.path.relpath(path, code_dir)
        real, real_code = os.path.realpath(path), os.path.realpath(code_dir)
        if rel.startswith(".."):
            errors.append(f"script: {path} is outside --code {code_dir}; put it inside or drop --code")
        elif os.path.commonpath([real, real_code]) != real_code:
            errors.append(f"script: {path} is a link to {real}, outside its code folder {code_dir} (only that "
                          f"folder is mounted, at {CODE_DIR}: the link would point at nothing in the nodes); "
                          f"pass the file itself, e.g. --script {real}, or copy it into {code_dir}")
        target_script = f"{CODE_DIR}/{rel.replace(os.sep, '/')}"
    if module is not None:
        if not MODULE_NAME.fullmatch(module):
            errors.append(f"module: {module!r} is not a Python module name; e.g. mypkg.train")
        elif code_dir is not None and not installs and _module_file(code_dir, module) is None:
            errors.append(f"module: {module} not found in --code {code_dir} (no {module.replace('.', '/')}.py "
                          f"or {module.replace('.', '/')}/__init__.py); fix --module or --code, or install it with "
                          f"--requirements")
    return code_dir, target_script


def resolve_code(node: NodeOptions, *, script: str | None = None, module: str | None = None,
                 code: str | None = None, argv: tuple[str, ...] = (), mesh: str | None = None,
                 nodes: int | None = None, nproc_per_node: int | None = None, run_dir: str | None = None,
                 timeout_s: float = Config.timeout_s, mounts: tuple[str, ...] = (), host_path=lambda p: p,
                 installs: bool = False) -> Launch:
    """The Launch of the user's own code: a script or a module, with its own argv.

    Host paths (script, code, run_dir, mount sources) are relative to the cwd. The script's folder
    (or ``code``) is mounted read-only at /code; a module without ``code`` comes from the image. installs:
    the job's requirements or wheels install packages, so a module not in ``code`` may come from them
    (``--code project --module torchtitan.train``: the data beside it, the trainer from PyPI).

    The request (job/request.py make_request) checked the script exists and that a mesh and nodes x
    ranks are not both given (a mesh wins here); this adds what needs the resolved paths.

    Raises:
        ConfigError: every problem: a missing code folder, module or mount source, a script outside
            the code folder, a bad shape (no mesh and no nodes x nproc_per_node), a bad timeout or node option.
    """
    errors: list[str] = []
    if (script is None) == (module is None):
        errors.append("entry: give exactly one of --script FILE and --module NAME")
    spec, nodes, nproc_per_node = _shape(mesh, nodes, nproc_per_node, errors)
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        errors.append(f"timeout_s: must be > 0 seconds, got {timeout_s}; e.g. --timeout-s 60")
    code_dir, target_script = _code_target(script, module, code, installs, errors)
    if code_dir is not None and run_dir is not None and os.path.realpath(run_dir) == os.path.realpath(code_dir):
        errors.append(f"run_dir: {os.path.abspath(run_dir)} is the code folder itself (mounted read-only at "
                      f"{CODE_DIR}; the run's records, compose file and working folder would be written among your "
                      f"files); pass a folder of its own, e.g. --run-dir runs/{os.path.basename(code_dir) or 'job'} "
                      f"(a run folder inside the code folder is fine: the code record skips it)")
    extra = _mounts(mounts, host_path, node.user, errors)
    if code_dir is not None and not errors and (why := unreadable(code_dir, node.user)):
        errors.append(f"code: {why}")
    _finish(errors, node, run_dir if run_dir is not None else "runs/x")  # raises listing every problem
    launch = Launch(nnodes=nodes, nproc_per_node=nproc_per_node, mesh=spec, module=module, script=target_script,
                    argv=tuple(argv), run_dir=host_path(os.path.abspath(run_dir)) if run_dir is not None else "",
                    mounts=((Mount(host_path(code_dir), CODE_DIR),) if code_dir else ()) + tuple(extra),
                    timeout_s=float(timeout_s), node=node)
    return launch if run_dir is not None else dataclasses.replace(launch, run_dir=f"runs/{launch.job_name}")
