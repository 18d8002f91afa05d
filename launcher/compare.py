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
import os
import re
import shutil
from dataclasses import dataclass, fields

from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.job.files import ROOT, host_abspath, repo_path
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.job.sections import (COMPARE_RUN, COMPARE_TRAINER, CompareOptions, JobOptions, NodeOptions,
                                              UpOptions)
from simcluster.launcher.compare_read import check_options, failure_text, read_series, result_text  # noqa: F401
from simcluster.launcher.job.fields import check_value
from simcluster.launcher.job.request import make_request, unknown
from simcluster.core.series import Comparison, compare_series
from simcluster.core.errors import ConfigError

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


COMPARE_KEYS = (*(f.name for f in fields(JobOptions)), "args", *(f.name for f in fields(NodeOptions)), *COMPARE_TRAINER,
                *COMPARE_RUN, *(f.name for f in fields(CompareOptions)))  # compare's keywords: the request's names


def sides(*, against: str | None = None, against_nodes: int | None = None, against_nproc_per_node: int | None = None,
          mesh: str | None = None, nodes: int | None = None, nproc_per_node: int | None = None,
          run_dir: str | None = None, **job) -> tuple[Side, Side]:
    """The two sides: the job's options (the request's names: script, module, code, args, mount, total_steps,
    no_cpu_bridges, requirements, wheel, timeout_s, traffic, trace_steps and the node options), layout A
    (mesh or nodes x nproc_per_node) and B (against or against_nodes x against_nproc_per_node), each side
    checked by the one JobRequest constructor (job/request.py) and resolved as `launcher up` resolves it,
    before anything starts; nothing is written. Paths are relative to the current folder.

    Raises:
        ConfigError: a bad or missing layout (naming that side's flags), or what the request refuses;
            the built-in trainer (use train.parity).
    """
    from simcluster.launcher.job.files import container_user

    script, module, code = job.get("script"), job.get("module"), job.get("code")
    if script is None and code is None and module in (None, "train", "simcluster.train"):
        raise ConfigError("--script: compare runs your own code: give --script FILE or --module NAME; the built-in "
                          "trainer's parity check is python -m train.parity --mesh 2x2x2 --steps 10")
    user = job.get("user") or container_user()
    layouts = [("A", _layout("A", mesh, nodes, nproc_per_node)),
               ("B", _layout("B", against, against_nodes, against_nproc_per_node))]
    run_dir = check_value("run_dir", run_dir)  # text, never empty: '' would be this folder, its a-/b- emptied
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


def empty_folders(sides, what) -> None:
    """Remove each side's run folder, so no earlier run's metrics, logs or resume state is read; what(side)
    names the side in the error (compare: "run A", sweep: "layout 1 node x 4 ranks").

    Raises:
        ConfigError: a folder that cannot be removed, naming it and the fix.
    """
    for side in sides:
        try:
            if os.path.exists(side.run_dir):
                shutil.rmtree(side.run_dir)
        except OSError as e:
            raise ConfigError(f"--run-dir: cannot empty {repo_path(side.run_dir)} for {what(side)}: {e}; remove "
                              f"it yourself or pass another --run-dir") from None


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
        from simcluster.launcher.docker.handle import Handle
        from simcluster.launcher.engines.registry import DEFAULT, ENGINES

        engine = ENGINES[DEFAULT]
        for side in sides:
            shaping.check(side.launch, engine, {})
            handle = Handle.for_run(side.run_dir)
            if any(c.status != "exited" for c in engine.nodes(handle, engine.attach(handle)).values()):
                raise ConfigError(f"--run-dir: the cluster of {side.name}'s folder {repo_path(side.run_dir)} is still "
                                  f"up; stop it with python -m launcher down --run-dir {repo_path(side.run_dir)}")

    def __call__(self, side: Side) -> int:
        """Run the side to its end; `up`'s exit code (0, 1, 130)."""
        from simcluster.launcher.engines.base import UpOptions
        from simcluster.launcher.engines.registry import DEFAULT, ENGINES

        runner, opts = ENGINES[DEFAULT], UpOptions(quiet=self.quiet)  # quiet: compose's own lines captured too
        runner.check(side.launch, opts)
        if not self.quiet:
            return runner.up(side.launch, side.command, opts)
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            return runner.up(side.launch, side.command, opts)


def compare(*, runner=None, **options) -> Comparison:
    """Run the same code on layout A, then on layout B, and compare ``metric`` step by step.

    options: `launcher compare`'s options by their names (COMPARE_KEYS; the request's sections'
    names, job/sections.py): your code and its arguments (script/module/code, args, mount, total_steps,
    no_cpu_bridges, requirements, wheel), layout A (mesh, or nodes and nproc_per_node), the node options
    (``mount_code=True``, ``image=...``), run_dir (the base folder), timeout_s, traffic, trace_steps,
    quiet (each run's lines only in its cluster.log), and CompareOptions: layout B (against, or
    against_nodes and against_nproc_per_node), metric (a key of the runs' metrics.jsonl rows),
    metric_regex (read the metric from the lines the ranks printed instead: one group, or named groups
    step and value), rtol (the largest relative difference |A - B| / |B| allowed). runner: what runs a
    side (default ComposeRun).

    Raises:
        ConfigError: bad input (before anything starts: an unknown keyword, the close ones named, or a
            value the one JobRequest constructor refuses), or run A logged no such metric (B is not run).
        RunFailed: a run failed (naming the side and its failing rank), or B logged no such metric.
        KeyboardInterrupt: interrupted (the running cluster was stopped).
        LauncherError: Docker or Compose failed.
    """
    for name in options:
        if name not in COMPARE_KEYS:
            raise unknown(name, sorted({*COMPARE_KEYS, "runner"}), "compare() takes `launcher compare`'s options by "
                          "name")
    cmp = CompareOptions(**{k: options.pop(k) for k in list(options) if k in CompareOptions.__dataclass_fields__})
    metric, metric_regex, rtol = cmp.metric, cmp.metric_regex, cmp.rtol
    quiet = options.pop("quiet", UpOptions.quiet)
    if not isinstance(quiet, bool):
        raise ConfigError(f"quiet: pass True or False, got {quiet!r}; e.g. quiet=True")
    metric = check_options(metric, metric_regex, rtol)
    both = sides(against=cmp.against, against_nodes=cmp.against_nodes,
                 against_nproc_per_node=cmp.against_nproc_per_node, **options)
    check_folders(both)
    runner = runner or ComposeRun(quiet)
    runner.check(both)
    if both[0].layout == both[1].layout:
        print(f"compare: A and B are the same layout ({both[0].layout}): two runs must agree (determinism)",
              flush=True)
    empty_folders(both, lambda side: f"run {side.name}")
    series = []
    for side in both:
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
            raise RunFailed(f"{e}; run {both[0].label} logged {len(series[0])} step(s) of it") from None
        if quiet:
            print(f"compare: run {side.label} ok, {len(series[-1])} step(s) of {metric}", flush=True)
    return compare_series(series[0], series[1], rtol, metric, (both[0].label, both[1].label))
