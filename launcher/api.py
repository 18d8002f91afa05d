"""The Python API of one run: ``simcluster.run(...) -> Run``; `launcher up` is a thin layer over it.

    python -c "import simcluster; r = simcluster.run(script='examples/ddp.py', nodes=2, nproc_per_node=2, \
args=['--steps', '3'], mount_code=True); print(r.ok, r.values('loss'))"

``run`` takes `up`'s options as typed keyword arguments (``steps=3`` is ``--steps 3``,
``mount_code=True`` is ``--mount-code``, ``mount=["a:/b"]`` repeats ``--mount``) and builds the one
frozen JobRequest from them (job/request.py make_request; no argparse): the CLI builds the same
from its flags, so both raise one ConfigError (exit 2 there) before anything starts. ``up`` is
what both run: the command's ``cmd_up`` calls it with the request. A run's outcome is read back from its folder
(observe/rundir.py: cluster.log, summary.json, metrics.jsonl, the instruments' records).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass

from simcluster.launcher.drills import faults as _faults
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.job.request import JobRequest, make_request
from simcluster.core import rundir
from simcluster.core import runlog
from simcluster.core.errors import ConfigError

CHAOS_JOIN_S = 10.0  # how long a run waits, after its cluster ended, for its chaos threads to say why they stopped


@dataclass(frozen=True)
class FailedRank:
    """A rank that printed a traceback in a failed run: its global rank, its node, the node's
    exit code (the container's: 1 for a rank's exception, 137 for a kill), the traceback's last
    lines (the exception line last; launcher/observe/failures.py's rules), whether it only saw a
    peer's connection close (peer_failed: a consequence, not the cause) and the name of the known torch bug
    its traceback matches (torch_bug: a failures.TORCH_BUGS entry's name, e.g. ``tp-compile-act-grad``; None
    for none; the summary prints its links and workarounds)."""

    rank: int
    node: str
    exit: int | None
    lines: tuple[str, ...]
    peer_failed: bool = False
    torch_bug: str | None = None

    @property
    def error(self) -> str:
        """The exception line, e.g. ``ValueError: boom``."""
        return self.lines[-1] if self.lines else ""

    def __str__(self) -> str:
        return "\n".join([f"rank {self.rank} on {self.node} (exit {self.exit}): {self.error}",
                          *(f"    {line}" for line in self.lines[:-1])])


@dataclass(frozen=True)
class Run:
    """One ended run of the simulated cluster, read from its folder.

    run_dir: the host run folder (absolute); launch: what ran (launcher/job/launch.py); exit_code:
    `up`'s (0 every node exited 0, 1 the run failed or timed out, 4 it hung: ``hang``); chaos: what its faults said.
    """

    run_dir: str
    launch: Launch
    exit_code: int
    chaos: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def summary(self) -> str:
        """The summary `launcher up` printed (``== summary: OK ==`` and its rows)."""
        return "\n".join(runlog.summary_lines(self.run_dir))

    @property
    def record(self) -> dict:
        """The summary as data (RUN_DIR/summary.json; observe/summary.py writes it); {} when none."""
        return runlog.read_summary(self.run_dir) or {}

    @property
    def hang(self) -> list[str]:
        """The stall's diagnosis (``HANG at step S after N s: ...``, simcluster/core/hang_diagnosis.py) when the
        run hung (exit_code 4), else []; every rank's record in RUN_DIR/hang.json, stacks in RUN_DIR/stacks/."""
        return list(self.record.get("hang") or [])

    @property
    def timed_out(self) -> bool:
        """Killed by ``wall_timeout_s``."""
        return bool(self.record.get("timed_out"))

    @property
    def failed(self) -> list[FailedRank]:
        """Each rank that printed a traceback (or a C++ abort) in a failed run, the cause first:
        ranks that only saw a peer's connection close come last; [] for a run that succeeded."""
        ranks = [FailedRank(r["rank"], r["node"], r.get("exit"), tuple(r.get("lines") or ()), r.get("peer_failed", False),
                            r.get("torch_bug")) for r in self.record.get("failed", [])]
        return sorted(ranks, key=lambda f: (f.peer_failed, f.rank))

    @property
    def metrics(self) -> list[dict]:
        """The run's steps, one merged row each, in step order: metrics.jsonl's rows joined with the
        instruments' records of your code (``step_time_s``, ``rss_mb``, ``traffic``; rundir.step_rows)."""
        return rundir.step_rows(self.run_dir)

    def values(self, key: str = "loss") -> list:
        """``key``'s value of each step that has one, in step order (e.g. the losses)."""
        return [row[key] for row in self.metrics if row.get(key) is not None]

    @property
    def traffic(self) -> dict[int, dict]:
        """step -> bytes, messages (by kind: pp_send, tp_all_reduce, ...) and bytes per link, every
        rank's summed (rundir.traffic_totals; recorded with ``traffic=1``); {} without."""
        return rundir.traffic_totals(self.run_dir)

    def logs(self, rank: int | None = None, node: str | None = None) -> list[str]:
        """cluster.log's lines: all, one node's (``node="node-1"``), or what one rank printed (``rank=3``)."""
        return runlog.log_lines(self.run_dir, node=node, rank=rank)

    def __repr__(self) -> str:
        return f"Run({self.launch.shape}, ok={self.ok}, exit_code={self.exit_code}, run_dir={self.run_dir!r})"


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


def up(args: JobRequest, chaos: tuple = (), chaos_lines: list[str] | None = None) -> tuple[Launch, int]:
    """Resolve, check and run one `launcher up` (its checked JobRequest, job/request.py), with faults
    from drills/faults.py applied during it; (its Launch, its exit code: 0, 1, 130 interrupted).

    Raises:
        ConfigError: bad options (every check of the CLI; nothing started, nothing written).
        LauncherError: Docker or Compose failed.
    """
    from simcluster.launcher.drills import shaping
    from simcluster.launcher.job.files import container_user, host_abspath
    from simcluster.launcher.job.options import resolve
    from simcluster.launcher.job.sections import UpOptions
    from simcluster.launcher.engines.registry import ENGINES, engine_named
    from simcluster.core.layout import host_names

    from simcluster.core.series_read import metric_pattern

    if args.metric_regex is not None:
        try:
            metric_pattern(args.metric_regex)
        except ValueError as e:
            raise ConfigError(f"metric_regex: {e}") from None
    engine = engine_named(args.target)
    launch, command = resolve(args, user=container_user())
    if args.metric_regex is not None and launch.train is not None:
        raise ConfigError(f"metric_regex: {args.metric_regex!r} reads a loss your code only prints, and the built-in "
                          f"trainer writes its own to metrics.jsonl (the summary reads it there); drop --metric-regex")
    opts = args.section(UpOptions)
    engine.check(launch, opts)  # an engine that only renders here refuses `up` first
    shaping.check(launch, engine, dict(opts.start_late))
    hosts = tuple(host_names(launch.engine.hosts or 0))
    if errors := _faults.check(chaos, launch.names, launch.world_size, hosts) + _fault_steps(chaos, launch):
        raise ConfigError("\n  ".join(["invalid launch:", *errors]))
    if any(not isinstance(f, _faults.HostFault) for f in chaos) and not engine.supports_chaos:
        takers = [name for name, e in ENGINES.items() if e.supports_chaos]
        raise ConfigError(f"chaos: faults are applied to {', '.join(takers)} runs; drop chaos or use "
                          f"target={takers[0]!r}")
    wait_s = opts.wall_timeout_s or 3600.0
    lines = chaos_lines if chaos_lines is not None else []
    threads = [_faults.start(f, host_abspath(launch.run_dir), wait_s, lines, engine) for f in chaos]
    try:
        return launch, engine.up(launch, command, opts)
    finally:
        for t in threads:
            t.join(CHAOS_JOIN_S)


def _fault_steps(chaos: tuple, launch: Launch) -> list[str]:
    """Faults scheduled after the run's last step, where it is known (the trainer's steps, or your
    code's total_steps): they would never fire."""
    last = launch.train.config.steps if launch.train is not None else launch.instruments.total_steps
    return [f"chaos: {f}: at_step {f.at_step} is after the run's last step {last}; e.g. "
            f"{type(f).__name__}(..., at_step={last})" for f in chaos
            if last is not None and isinstance(f.at_step, int) and f.at_step > last]


def run(script: str | None = None, module: str | None = None, code: str | None = None, mesh: str | None = None,
        nodes: int | None = None, nproc_per_node: int | None = None, args=(), run_dir: str | None = None,
        chaos=None, echo: bool = False, **options) -> Run:
    """Run one job on a fresh simulated cluster to its end, and return its Run.

    The built-in trainer when neither script nor module is given (its options by name: model="tiny",
    steps=3); else your torchrun script or module with ``args``, on ``mesh`` ("2x2x2": nodes = pp,
    SIMCLUSTER_PP/DP/TP set) or ``nodes`` x ``nproc_per_node``. options: any other `launcher up`
    flag by name (timeout_s: the job's timeout; wall_timeout_s: the whole run's; max_restarts,
    cpus_per_node, memory_per_node, mount_code, traffic, trace_steps, image, ...). chaos: a fault
    or a list of them (``Kill("node-1", at_step=3)``; drills/faults.py). echo: print what
    `launcher up` prints (default: only its cluster.log gets it). Paths are relative to the cwd.

    Raises:
        ConfigError: bad input, with the CLI's message (a mesh and nodes both given, a missing
            script, an unknown keyword, ...); nothing is started or written.
        LauncherError: no Docker engine, or Docker or Compose failed.
        KeyboardInterrupt: interrupted (Ctrl-C); the cluster was stopped and removed first.
    """
    if not isinstance(echo, bool):
        raise ConfigError(f"echo: pass True or False, got {echo!r}; e.g. echo=True")
    options.setdefault("quiet", not echo)
    parsed = make_request("up", script=script, module=module, code=code, mesh=mesh, nodes=nodes,
                          nproc_per_node=nproc_per_node, run_dir=run_dir, args=args, **options)
    faults = _faults.as_faults(chaos)
    lines: list[str] = []
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with contextlib.ExitStack() as stack:
            if not echo:
                stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
            launch, code = up(parsed, faults, lines)
    finally:
        if main:
            signal.signal(signal.SIGTERM, sigterm)
    from simcluster.launcher.job.files import host_abspath

    if code == 130:
        raise KeyboardInterrupt
    return Run(host_abspath(launch.run_dir), launch, code, tuple(lines))
