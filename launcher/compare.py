"""Parity of your own code across two layouts of the simulated cluster: ``launcher compare``.

    python -m launcher compare --script examples/manual_3d.py --mesh 2x2x2 --against 2x2x1 -- --steps 3
    python -m launcher compare --script train.py --mesh 2x2x2 --against-nodes 1 --against-nproc-per-node 1 -- ARGS
    python -c "from simcluster.launcher.compare import compare; print(compare(script='examples/manual_3d.py', \
mesh='2x2x2', against='2x2x1', args=['--steps', '3'], mount_code=True).ok)"

The same code runs on layout A (``--mesh`` or ``--nodes/--nproc-per-node``), then on layout B
(``--against`` or ``--against-nodes/--against-nproc-per-node``), each a ``launcher up`` run into
its own fresh folder (BASE/a-<layout>, BASE/b-<layout>; BASE: ``--run-dir``, default
runs/<script or module>-compare); then one metric is compared step by step (observe/series.py,
the comparison train.parity uses too). A and B may be the same layout: two runs of one layout
must agree too (a determinism check). ``compare`` returns the Comparison; the CLI (cli.py) prints
``result_text`` and exits 0 when it is ok, 1 when not.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
import shutil
from dataclasses import dataclass, fields

from simcluster.launcher.engines.docker import LauncherError
from simcluster.launcher.job.files import ROOT, host_abspath, repo_path
from simcluster.launcher.job.launch import Launch, NodeOptions
from simcluster.launcher.compare_read import check_options, failure_text, read_series, result_text  # noqa: F401
from simcluster.launcher.job.request import make_request, unknown
from simcluster.train.series import Comparison, compare_series
from simcluster.train.config import Config
from simcluster.train.errors import ConfigError

FLAGS = {"A": ("--mesh", "--nodes", "--nproc-per-node"), "B": ("--against", "--against-nodes",
                                                               "--against-nproc-per-node")}


class RunFailed(LauncherError):
    """A side's run failed (a rank raised, a node was lost) or logged no value of the metric that
    the other side logged: the message names the side, its layout and its summary's failing rank."""


@dataclass(frozen=True)
class Side:
    """One of the two runs: name "A" or "B", its layout (``mesh 2x2x2``, ``1 node x 1 rank``), its
    Launch, and the ``generate`` line of its compose file's header."""

    name: str
    layout: str
    launch: Launch
    command: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.layout})"

    @property
    def run_dir(self) -> str:
        """Its host run folder, absolute."""
        return host_abspath(self.launch.run_dir)

    @property
    def up_line(self) -> str:
        """The ``launcher up`` line that runs this side alone."""
        return "python -m launcher up" + self.command.removeprefix("python -m launcher generate")


def _layout(side: str, mesh, nodes, nproc) -> dict:
    """One side's layout keywords for its request (its values are the request's to check).

    Raises:
        ConfigError: neither or both of a mesh and nodes x ranks, naming the side's flags.
    """
    m, n, p = FLAGS[side]
    fix = (f"give {side}'s layout as {m} PPxDPxTP (e.g. {m} {'2x2x2' if side == 'A' else '2x2x1'}) or {n} N {p} M "
           f"(e.g. {n} 1 {p} 1: one process)")
    if mesh is not None and (nodes is not None or nproc is not None):
        raise ConfigError(f"{m}: {side}'s layout is either {m} or {n} with {p}, not both; {fix}")
    if mesh is not None:
        return {"mesh": mesh}
    if nodes is None and nproc is None:
        raise ConfigError(f"{m}: {fix}")
    if nodes is None or nproc is None:
        raise ConfigError(f"{n}: {fix} (got {n} {nodes}, {p} {nproc})")
    return {"nodes": nodes, "nproc_per_node": nproc}


def _side(side: str, job: dict, layout: dict, base: str, user: str) -> Side:
    """One side: its request built once by the one constructor (job/request.py), resolved as `up` would.

    Raises:
        ConfigError: the request's errors; a layout's named by the side's flag (B: --against...).
    """
    from simcluster.launcher.engines.base import UpOptions
    from simcluster.launcher.engines.registry import DEFAULT, ENGINES
    from simcluster.launcher.job.options import resolve

    if "mesh" in layout:
        folder = "mesh-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", str(layout["mesh"]).lower().replace(" ", ""))
    else:
        folder = f"nodes-{layout['nodes']}x{layout['nproc_per_node']}"
    where = dict(zip(("mesh", "nodes", "nproc_per_node"), FLAGS[side]))
    try:
        req = make_request("up", **job, **layout, run_dir=os.path.join(base, f"{side.lower()}-{folder}"))
        launch, command = resolve(req, user=user)  # the side's one mesh parse
    except ConfigError as e:
        text = str(e).removeprefix("invalid launch:\n  ")
        name = getattr(e, "field", None) or ("mesh" if text.startswith("mesh:") else None)
        if name not in where or (side == "A" and name != "mesh"):
            raise
        raise ConfigError(f"{where[name]}: {text}") from None
    if launch.mesh is not None:
        words = f"mesh {launch.mesh}"
    else:
        nodes, nproc = launch.nnodes, launch.nproc_per_node
        words = f"{nodes} node{'s' * (nodes > 1)} x {nproc} rank{'s' * (nproc > 1)}"
    ENGINES[DEFAULT].check(launch, UpOptions())
    return Side(side, words, launch, command)


def plan(*, script: str | None = None, module: str | None = None, code: str | None = None, args=(),
         mesh: str | None = None, nodes: int | None = None, nproc_per_node: int | None = None,
         against: str | None = None, against_nodes: int | None = None, against_nproc_per_node: int | None = None,
         run_dir: str | None = None, mounts=(), node: NodeOptions | None = None, timeout_s: float = Config.timeout_s,
         total_steps: int | None = None, cpu_bridges: bool = True, simulated_gpus: bool = True,
         gpu: str | None = None, traffic: int = 0,
         trace_steps: str | None = None, requirements: str | None = None, wheel=(), env=(),
         **node_options) -> tuple[Side, Side]:
    """The two sides, every input checked by the one JobRequest constructor (job/request.py) and
    resolved as `launcher up` resolves it, before anything starts; nothing is written. Paths are
    relative to the current folder. total_steps, cpu_bridges, traffic, trace_steps: the instruments'
    options of your code, for both runs (`up --total-steps`, `--no-cpu-bridges`, `--traffic 1`, simulated_gpus
    (`--no-simulated-gpus`), gpu (`--gpu a100-80g`),
    `--trace-steps 2`); requirements, wheel: your code's dependencies (`--requirements`, `--wheel`:
    one derived image, both runs); env: KEY=VALUE entries for every rank of both runs (`--env`);
    node_options: NodeOptions' fields by name (``mount_code=True``), over ``node``'s.

    Raises:
        ConfigError: a bad or missing layout (naming that side's flags), script, module, code
            folder, mount, node option or timeout, a value of the wrong type; the built-in trainer
            (use train.parity).
    """
    from simcluster.launcher.job.files import container_user

    if script is None and code is None and module in (None, "train", "simcluster.train"):
        raise ConfigError("--script: compare runs your own code: give --script FILE or --module NAME; the built-in "
                          "trainer's parity check is python -m train.parity --mesh 2x2x2 --steps 10")
    for name, value in (("cpu_bridges", cpu_bridges), ("simulated_gpus", simulated_gpus)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: pass True or False, got {value!r}; e.g. {name}=False")
    if node is not None and not isinstance(node, NodeOptions):
        raise ConfigError(f"node: a NodeOptions, got {node!r}; e.g. node=NodeOptions(mount_code=True), or "
                          f"mount_code=True")
    defaults = NodeOptions()
    node_kw = {f.name: getattr(node, f.name) for f in fields(NodeOptions)
               if node is not None and getattr(node, f.name) != getattr(defaults, f.name)}
    node_kw.update({k: v for k, v in node_options.items() if v is not None})
    given_user = node_kw.pop("user", None)
    user = given_user or container_user()
    job = dict(script=script, module=module, code=code, args=args, mount=mounts, total_steps=total_steps,
               no_cpu_bridges=not cpu_bridges, no_simulated_gpus=not simulated_gpus, gpu=gpu, traffic=traffic or None,
               trace_steps=trace_steps, user=given_user,
               timeout_s=None if timeout_s == Config.timeout_s else timeout_s, requirements=requirements,
               wheel=wheel, env=env, **node_kw)
    layouts = [("A", _layout("A", mesh, nodes, nproc_per_node)),
               ("B", _layout("B", against, against_nodes, against_nproc_per_node))]
    if run_dir is not None and not isinstance(run_dir, str):
        raise ConfigError(f"run_dir: a folder (text), got {run_dir!r}; e.g. run_dir='runs/ddp-compare'")
    name = os.path.splitext(os.path.basename(script))[0] if isinstance(script, str) else module
    base = os.path.abspath(run_dir) if run_dir is not None else os.path.join(ROOT, "runs", f"{name}-compare")
    a, b = (_side(side, job, layout, base, user) for side, layout in layouts)
    return a, b


def check_folders(sides: tuple[Side, Side]) -> None:
    """Each side's run folder is absent, empty or an earlier run's (it holds a compose.yml): compare
    empties it before its run, and never a folder it did not make.

    Raises:
        ConfigError: naming the folder and the fix.
    """
    for side in sides:
        d = side.run_dir
        if os.path.isdir(d) and os.listdir(d) and not os.path.isfile(os.path.join(d, "compose.yml")):
            raise ConfigError(f"--run-dir: {repo_path(d)} holds files but is no run folder (no compose.yml); compare "
                              f"empties {side.name}'s folder before running it: pass another --run-dir")


class ComposeRun:
    """Runs one side with `launcher up`'s default engine (engines/registry.py DEFAULT: the Compose
    simulation, whose run folder holds compose.yml); quiet: its lines go to its cluster.log only."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def check(self, sides: tuple[Side, Side]) -> None:
        """No cluster of either run folder is still up (before either starts).

        Raises:
            ConfigError: naming the folder and `launcher down`.
        """
        from simcluster.launcher.drills import shaping
        from simcluster.launcher.engines import docker as engine
        from simcluster.launcher.engines.handle import Handle
        from simcluster.launcher.engines.registry import DEFAULT, ENGINES

        for side in sides:
            shaping.check(side.launch, "up", ENGINES[DEFAULT], {})
            project = Handle.for_run(side.run_dir).project
            if any(c.status != "exited" for c in engine.containers(project).values()):
                raise ConfigError(f"--run-dir: the cluster of {side.name}'s folder {repo_path(side.run_dir)} is still "
                                  f"up; stop it with python -m launcher down --run-dir {repo_path(side.run_dir)}")

    def __call__(self, side: Side) -> int:
        """Run the side to its end; `up`'s exit code (0, 1, 130)."""
        from simcluster.launcher.engines.base import UpOptions
        from simcluster.launcher.engines.registry import DEFAULT, ENGINES

        runner, opts = ENGINES[DEFAULT], UpOptions()
        runner.check(side.launch, opts)
        if not self.quiet:
            return runner.up(side.launch, side.command, opts)
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            return runner.up(side.launch, side.command, opts)


def compare(*, metric: str = "loss", metric_regex: str | None = None, rtol: float = 1e-5, quiet: bool = False,
            runner=None, **layout_and_code) -> Comparison:
    """Run the same code on layout A, then on layout B, and compare ``metric`` step by step.

    layout_and_code: plan()'s arguments (script/module/code, args, mesh/nodes/nproc_per_node,
    against/against_nodes/against_nproc_per_node, run_dir, mounts, node, timeout_s, total_steps,
    cpu_bridges, traffic, trace_steps), or node options by name (``mount_code=True``, ``image=...``). metric: a key of the runs' metrics.jsonl
    rows; metric_regex: read the metric from the lines the ranks printed instead (one group, or
    named groups step and value); rtol: the largest relative difference |A - B| / |B| allowed.
    quiet: each run's lines only in its cluster.log; runner: what runs a side (default ComposeRun).

    Raises:
        ConfigError: bad input (before anything starts: an unknown keyword, the close ones named, or a
            value the one JobRequest constructor refuses), or run A logged no such metric (B is not run).
        RunFailed: a run failed (naming the side and its failing rank), or B logged no such metric.
        KeyboardInterrupt: interrupted (the running cluster was stopped).
        LauncherError: Docker or Compose failed.
    """
    known = (set(inspect.signature(plan).parameters) - {"node_options"}) | {f.name for f in fields(NodeOptions)} \
        | {"strict_memory"}
    for name in layout_and_code:
        if name not in known:
            raise unknown(name, sorted(known | set(inspect.signature(compare).parameters) - {"layout_and_code"}),
                          "compare() takes plan()'s keywords and the node options by name")
    if not isinstance(quiet, bool):
        raise ConfigError(f"quiet: pass True or False, got {quiet!r}; e.g. quiet=True")
    check_options(metric, metric_regex, rtol)
    sides = plan(**layout_and_code)
    check_folders(sides)
    runner = runner or ComposeRun(quiet)
    runner.check(sides)
    if sides[0].layout == sides[1].layout:
        print(f"compare: A and B are the same layout ({sides[0].layout}): two runs must agree (determinism)",
              flush=True)
    for side in sides:  # fresh folders: no earlier run's metrics, logs or resume state
        try:
            if os.path.exists(side.run_dir):
                shutil.rmtree(side.run_dir)
        except OSError as e:
            raise ConfigError(f"--run-dir: cannot empty {repo_path(side.run_dir)} for run {side.name}: {e}; remove "
                              f"it yourself or pass another --run-dir") from None
    series = []
    for side in sides:
        print(f"compare: run {side.label} into {repo_path(side.run_dir)}\n  = {side.up_line}", flush=True)
        code = runner(side)
        if code == 130:
            raise KeyboardInterrupt
        if code != 0:
            rest = "; B was not run" if side.name == "A" else ""
            raise RunFailed(f"compare: run {side.label} failed (exit {code}): {failure_text(side)}{rest}; can your "
                            f"code take this layout ({side.launch.world_size} ranks)? Its log: "
                            f"{repo_path(side.run_dir)}/cluster.log")
        try:
            series.append(read_series(side, metric, metric_regex))
        except ConfigError as e:
            if side.name == "A":
                raise ConfigError(f"{e} (B was not run)") from None
            raise RunFailed(f"{e}; run {sides[0].label} logged {len(series[0])} step(s) of it") from None
        if quiet:
            print(f"compare: run {side.label} ok, {len(series[-1])} step(s) of {metric}", flush=True)
    return compare_series(series[0], series[1], rtol, metric, (sides[0].label, sides[1].label))
