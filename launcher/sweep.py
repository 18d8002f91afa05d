"""The layout sweep: one job, one mesh, the node boundaries moved; a metric compared step by step: ``launcher sweep``.

    python -m launcher sweep --script examples/bugs/layout_bugs.py --nodes 2 --nproc-per-node 1 --mount-code -- --steps 3
    python -m launcher sweep --mesh 2x1x1 --model tiny --steps 2 --mount-code
    python -c "from simcluster.launcher.sweep import layouts; print([x.text for x in layouts(2, 4)])"

The job runs (each a ``launcher up`` run of the Compose simulation, as ``compare``'s sides) on its
own node layout, on one node holding every rank, and on one rank per node (``layouts``: the same
layout twice runs once), with the same mesh: SIMCLUSTER_PP/DP/TP, WORLD_SIZE and RANK are the
same on each; what moves is which ranks share a node: LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
(the node's index), the node's own files (/tmp), the host name. Then ``metric`` of each layout
(compare_read.read_series: metrics.jsonl's step rows, or printed lines with --metric-regex) is
compared step by step against the job's own layout (simcluster/core/series.py, b the reference). The first
step at which a layout differs (a value beyond rtol, or a step it lacks: a run that failed or
stopped early) is named with that layout. Code that is right on every layout takes its global
indices from RANK and WORLD_SIZE and shares files through the run folder ($SIMCLUSTER_OUTPUT_DIR).

Runs go to BASE/nodes-NxM (BASE: --run-dir, default runs/<script, module or mesh>-sweep), each
emptied first. A mesh job on a layout other than its own (nodes = pp) has no `up` line: `up` lays
a mesh out one pipeline stage a node; the sweep alone moves it (its compose file's header says so).
Unlike compare, a run that fails does not stop the sweep: its steps are what it logged.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from simcluster.launcher.compare import ComposeRun, Side, check_folders, empty_folders
from simcluster.launcher.compare_read import check_options, check_trainer_metric, failure_text, read_series
from simcluster.launcher.job.files import ROOT, repo_path
from simcluster.launcher.job.request import JobRequest, make_request
from simcluster.launcher.job.sections import MAX_NODES, MAX_RANKS, CompareOptions
from simcluster.core.errors import ConfigError
from simcluster.core.series import Comparison, Series, compare_series, fmt

HINT = ("what moves with the node boundaries: LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, a node's own files "
        "(/tmp) and its host name; use RANK and WORLD_SIZE for global indices (a pipeline stage, a data "
        "shard) and the run folder ($SIMCLUSTER_OUTPUT_DIR) for files other ranks read")


@dataclass(frozen=True)
class Layout:
    """One node layout of the job's ranks: nodes x nproc; own: the job's own."""

    nodes: int
    nproc: int
    own: bool = False

    @property
    def text(self) -> str:
        """``2 nodes x 4 ranks``, ``1 node x 1 rank``."""
        return f"{self.nodes} node{'s' * (self.nodes > 1)} x {self.nproc} rank{'s' * (self.nproc > 1)}"

    @property
    def name(self) -> str:
        """What the sweep calls it: ``own``, ``one node``, ``rank per node``."""
        return "own" if self.own else "one node" if self.nodes == 1 else "rank per node"

    @property
    def folder(self) -> str:
        return f"nodes-{self.nodes}x{self.nproc}"


def layouts(nodes: int, nproc: int) -> tuple[Layout, ...]:
    """The job's own layout (nodes x nproc), then one node holding every rank, then one rank per
    node; a layout equal to an earlier one is left out (2 x 1: own and one node)."""
    world = nodes * nproc
    out: list[Layout] = [Layout(nodes, nproc, own=True)]
    for n, m in ((1, world), (world, 1)):
        if all((x.nodes, x.nproc) != (n, m) for x in out):
            out.append(Layout(n, m))
    return tuple(out)


def _base(request: JobRequest) -> str:
    if request.run_dir is not None:
        return os.path.abspath(request.run_dir)
    if request.script is not None:
        name = os.path.splitext(os.path.basename(request.script))[0]
    else:
        name = request.module if not request.builtin else f"mesh-{request.mesh or '2x2x2'}".lower()
    return os.path.join(ROOT, "runs", f"{name}-sweep")


def plan(request: JobRequest) -> tuple[Side, ...]:
    """Each layout's side (compare.Side: name = the layout's name, layout = its text), resolved as
    `up` resolves its request, before anything starts; nothing is written. The request's run_dir is
    the base folder. A mesh job keeps its mesh on every layout (its Launch's nodes moved).

    Raises:
        ConfigError: what `up` refuses of the request; a target other than compose.
    """
    from simcluster.launcher.engines.base import UpOptions
    from simcluster.launcher.engines.registry import DEFAULT, ENGINES
    from simcluster.launcher.job.files import container_user
    from simcluster.launcher.job.options import resolve

    if request.target != DEFAULT:
        raise ConfigError(f"target: the sweep runs each layout on the {DEFAULT} simulation, got {request.target!r}; "
                          f"drop --target")
    user, base = container_user(), _base(request)
    given = {k: v for k, v in request.given().items() if k != "run_dir"}
    own, _ = resolve(make_request("up", **given, run_dir=base), user=user)  # its nodes and ranks; nothing written
    found, world = layouts(own.nnodes, own.nproc_per_node), own.nnodes * own.nproc_per_node
    if world > min(MAX_RANKS, MAX_NODES):
        raise ConfigError(f"sweep: your job's {world} ranks ({found[0].text}) would be {world} ranks on one node and "
                          f"{world} nodes of one rank, and a simulated cluster holds at most {MAX_RANKS} ranks a "
                          f"node and {MAX_NODES} nodes; sweep a job of at most {min(MAX_RANKS, MAX_NODES)} ranks")
    if len(found) < 2:
        raise ConfigError(f"sweep: a job of {world} rank has one layout ({found[0].text}), "
                          f"so there is nothing to compare it with; sweep a job of at least 2 ranks, e.g. --nodes 2 "
                          f"--nproc-per-node 1 (or --mesh 2x1x1), or run it once with `launcher up`")
    sides = []
    for layout in found:
        run_dir = os.path.join(base, layout.folder)
        words = layout.text if own.mesh is None else f"mesh {own.mesh} on {layout.text}"
        if own.mesh is None:
            launch, command = resolve(make_request("up", **{**given, "nodes": layout.nodes,
                                                            "nproc_per_node": layout.nproc}, run_dir=run_dir), user=user)
        else:
            launch, command = resolve(make_request("up", **given, run_dir=run_dir), user=user)
            if not layout.own:
                launch = dataclasses.replace(launch, nnodes=layout.nodes, nproc_per_node=layout.nproc)
                command = ("python -m launcher sweep" + command.removeprefix("python -m launcher generate")
                           + f"  (the sweep's layout {words}: no `up` line lays a mesh out so)")
        try:
            ENGINES[DEFAULT].check(launch, UpOptions())
        except ConfigError as e:
            if layout.own:
                raise
            raise ConfigError(f"sweep: the {layout.name} layout it derives from your {found[0].text} ({words}) "
                              f"cannot run here: {e}; sweep a smaller job, or compare two layouts you choose with "
                              f"`launcher compare`") from None
        sides.append(Side(layout.name, words, launch, command))
    return tuple(sides)


@dataclass(frozen=True)
class LayoutRun:
    """One layout's run: its side, `up`'s exit code, its metric series, why it failed ("" when it
    did not) and why it has no series ("" when it has one)."""

    side: Side
    exit_code: int
    series: tuple[tuple[int, float], ...]
    failure: str = ""
    missing: str = ""


@dataclass(frozen=True)
class Sweep:
    """The sweep's outcome. runs: each layout's, the job's own first; comparisons: each other layout
    against the own (labels: that layout's, the own's; b the reference). first: (step, the run of
    the first layout that differs there) or None; ok: every run exited 0 and every comparison is ok."""

    metric: str
    rtol: float
    runs: tuple[LayoutRun, ...]
    comparisons: tuple[Comparison, ...]

    @property
    def ok(self) -> bool:
        return all(r.exit_code == 0 for r in self.runs) and all(c.ok for c in self.comparisons)

    @property
    def first(self) -> tuple[int, LayoutRun] | None:
        """The first step at which a layout differs from the own (beyond rtol, or a step only one of
        them has), and that layout's run (the earlier layout when two differ at one step)."""
        found = []
        for run, c in zip(self.runs[1:], self.comparisons):
            steps = [s for s, _ in c.only_a + c.only_b] + ([c.first_divergence.step] if c.first_divergence else [])
            if steps:
                found.append((min(steps), run))
        own = self.runs[0]
        if not found and own.exit_code != 0 and self.comparisons:
            found.append((1 + max((s for s, _ in own.series), default=0), own))
        return min(found, key=lambda f: f[0]) if found else None

    def table(self) -> str:
        """step, the own layout's value, then per other layout its value and rel_diff (``-`` and
        ``missing`` where a run lacks the step)."""
        own = dict(self.runs[0].series)
        header = ["step", self.runs[0].side.label]
        for run in self.runs[1:]:
            header += [run.side.label, "rel_diff"]
        steps = sorted(set(own) | {s for r in self.runs[1:] for s, _ in r.series})
        lines = [header]
        for step in steps:
            cells = [str(step), fmt(own[step]) if step in own else "-"]
            for c in self.comparisons:
                row = next((r for r in c.rows if r.step == step), None)
                mine = dict(c.only_a)
                cells += [fmt(row.a), f"{row.rel:.1e}"] if row else [fmt(mine[step]) if step in mine else "-", "missing"]
            lines.append(cells)
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)

    def verdict(self) -> list[str]:
        """The lines after the table: each failed run, the first difference (or that all agree), the hint."""
        lines = [f"sweep: {r.side.label} failed (exit {r.exit_code}): {r.failure}" for r in self.runs if r.exit_code]
        lines += [f"sweep: {r.side.label}: {r.missing}" for r in self.runs if r.missing]
        own = self.runs[0]
        labels = ", ".join(r.side.label for r in self.runs)
        if self.ok:
            n = len(own.series)
            return lines + [f"sweep: OK: {self.metric} agrees within rtol {self.rtol:g} at all {n} step{'s' * (n != 1)} "
                            f"on every layout: {labels}"]
        first = self.first
        if first is None:  # only the own failed and nothing else ran to compare, or no step anywhere
            return lines + [f"sweep: FAILED: {own.side.label} failed; no layout to compare"]
        step, run = first
        if run is own:
            what = f"{own.side.label} stops before step {step} (the others agree with it up to there)"
        else:
            c = self.comparisons[self.runs.index(run) - 1]
            row = next((r for r in c.rows if r.step == step), None)
            mine, theirs = dict(run.series).get(step), dict(own.series).get(step)
            if row is not None:
                what = (f"{run.side.label} {fmt(row.a)} against {fmt(row.b)} on {own.side.label} (rel diff "
                        f"{row.rel:.1e} > rtol {self.rtol:g})")
            elif mine is None:
                what = f"{run.side.label} has no value there ({fmt(theirs)} on {own.side.label})"
            else:
                what = f"{run.side.label} {fmt(mine)}, {own.side.label} has no value there"
            others = [r.side.label for r, cc in zip(self.runs[1:], self.comparisons) if r is not run and not cc.ok]
            if others:
                what += f"; {', '.join(others)} differ{'s' * (len(others) == 1)} too"
        return lines + [f"sweep: DIFFERS: {self.metric} first differs at step {step}: {what}", f"  {HINT}"]


def result_text(s: Sweep) -> str:
    """What `launcher sweep` prints at the end: the table and the verdict lines."""
    head = f"sweep {s.metric} step by step against the job's own layout: rel_diff = |X - own| / |own|, rtol {s.rtol:g}"
    return "\n".join([head, s.table(), *s.verdict()])


def _series(side: Side, metric: str, metric_regex: str | None) -> tuple[Series, str]:
    """The side's series and, when it has none, why (read_series' message)."""
    try:
        return read_series(side, metric, metric_regex), ""
    except ConfigError as e:
        return [], str(e)


def sweep_request(request: JobRequest, *, metric: str | None = CompareOptions.metric, metric_regex: str | None = None,
                  rtol: float = CompareOptions.rtol, quiet: bool = False, runner=None) -> Sweep:
    """The sweep of one checked JobRequest (its run_dir: the base folder); see the module docstring.

    Raises:
        ConfigError: bad input (before anything starts), or the own layout ran and logged no such
            metric (the others are not run).
        KeyboardInterrupt: interrupted (the running cluster was stopped).
        LauncherError: Docker or Compose failed.
    """
    if not isinstance(quiet, bool):
        raise ConfigError(f"quiet: pass True or False, got {quiet!r}; e.g. quiet=True")
    metric = check_options(metric, metric_regex, rtol)
    sides = plan(request)
    if sides[0].launch.train is not None and metric_regex is None:  # the built-in trainer: its keys are known
        check_trainer_metric(metric, sides[0].launch.train.config)
    check_folders(sides)
    runner = runner or ComposeRun(quiet)
    runner.check(sides)
    empty_folders(sides, lambda side: f"layout {side.label}")
    runs: list[LayoutRun] = []
    for side in sides:
        line = side.up_line if side.command.startswith("python -m launcher generate") else side.command
        print(f"sweep: run {side.label} into {repo_path(side.run_dir)}\n  = {line}", flush=True)
        code = runner(side)
        if code == 130:
            raise KeyboardInterrupt
        series, missing = _series(side, metric, metric_regex)
        if code == 0 and missing and side is sides[0]:
            raise ConfigError(f"{missing} (the other layouts were not run)")
        runs.append(LayoutRun(side, code, tuple(series), failure_text(side) if code else "",
                              missing if code == 0 else ""))
        if quiet:
            state = "ok" if code == 0 else f"failed (exit {code})"
            print(f"sweep: run {side.label} {state}, {len(series)} step(s) of {metric}", flush=True)
    own = list(runs[0].series)
    comparisons = tuple(compare_series(list(r.series), own, rtol, metric, (r.side.label, runs[0].side.label))
                        for r in runs[1:])
    return Sweep(metric, rtol, tuple(runs), comparisons)


def sweep(script: str | None = None, module: str | None = None, code: str | None = None, mesh: str | None = None,
          nodes: int | None = None, nproc_per_node: int | None = None, args=(), run_dir: str | None = None, *,
          metric: str | None = CompareOptions.metric, metric_regex: str | None = None,
          rtol: float = CompareOptions.rtol, quiet: bool = False, runner=None, **options) -> Sweep:
    """Run one job on its own node layout, on one node and on one rank per node, and compare
    ``metric`` step by step (``simcluster.sweep``; `launcher sweep` is a layer over it).

    The built-in trainer when neither script nor module is given (its options by name: model="tiny",
    steps=3), else your code with ``args``, on ``mesh`` or ``nodes`` x ``nproc_per_node``; options:
    `launcher up`'s other options by name (mount_code=True, timeout_s=60, ...). run_dir: the base
    folder of the layouts' runs. metric, metric_regex, rtol: as compare's. quiet: each run's lines
    only in its cluster.log. runner: what runs a side (default compare.ComposeRun).

    Raises:
        ConfigError: bad input (nothing started), or the own layout logged no such metric.
        KeyboardInterrupt: interrupted.
        LauncherError: Docker or Compose failed.
    """
    request = make_request("up", script=script, module=module, code=code, mesh=mesh, nodes=nodes,
                           nproc_per_node=nproc_per_node, run_dir=run_dir, args=args, **options)
    return sweep_request(request, metric=metric, metric_regex=metric_regex, rtol=rtol, quiet=quiet, runner=runner)
