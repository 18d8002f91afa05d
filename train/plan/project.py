"""A run measured here, projected onto other hardware: the same job's step time there, with its parts.

    python -m launcher up --mesh 2x2x2 --model small --steps 6 --traffic 1 --trace-steps 6 --run-dir runs/m
    python -m launcher project runs/m --hardware h100-sxm-8x
    python -m launcher project runs/m --hardware local --inter-node-bandwidth 50mbit

Read from the run folder (the built-in trainer's records): config.yaml (the job), metrics.jsonl
(the step's measured seconds: the median of the untraced steps after the first), trace.json (each
microbatch's ``forward``/``backward`` events of a traced step and the communication inside them)
and traffic/rank-R.jsonl (the traced step's messages per kind and link).

The rule: each measured part is scaled by its model's ratio, target over here (``here`` is the
``local`` calibration, hardware.py), and the pipeline is run again on the target's numbers:
- an action (a stage's forward or backward of a microbatch, the mean over the stage's ranks and
  microbatches; the profiler's slowdown taken out by the step's traced/untraced ratio) is its
  compute, scaled by the ratio of a rank's FLOP/s (here: a core's share, as steptime.py), plus
  the TP all-reduces and FSDP collectives inside it, spread evenly over the rank's actions: on
  the target, their ring-model seconds (steptime.comm_parts) plus, where the target's ranks share
  cores as here, what was measured here beyond the model here (waiting for a peer's turn on a
  core; a device per rank has none of it);
- the sends between pp stages are priced on each hardware (steptime.send_s) and the schedule's
  order is run with them (schedule.simulate): the window there minus the window here is what
  the pipeline gains or loses;
- the rest of the step (optimizer, gradient clipping, bookkeeping: the measured step minus the
  window here) is scaled like compute.
The same hardware projects the measured step exactly. Left out: what steptime.LEFT_OUT lists,
and any change of the kernels' efficiency with the shapes of another device.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
from dataclasses import dataclass

from simcluster.core import rundir
from simcluster.core import runlog
from simcluster.core.errors import ConfigError
from simcluster.core.config import TrainRun, resolve, traced_steps
from simcluster.core.config_types import config_from_dict
from simcluster.core.hardware import Hardware
from simcluster.train.plan.schedule import rank_orders, simulate
from simcluster.train.plan.steptime import INSIDE, LEFT_OUT, comm_parts, send_bytes, send_pair, send_s

FIX = ("run the built-in trainer with --traffic 1 --trace-steps S, S after the first step and --steps above it "
       "(an untraced step beside it), e.g. python -m launcher up --mesh {mesh} --model small --steps 6 --traffic 1 "
       "--trace-steps 5 --run-dir runs/m")
COMM_EVENTS = ("_c10d_functional::", "FSDP::all_gather", "FSDP::post_backward_reduce")


@dataclass(frozen=True)
class Measured:
    """What a run folder holds for a projection. step_s: the untraced step (seconds); traced_s: the
    traced step's own length; actions: (kind "F"|"B"|"I"|"W", stage) -> seconds, traced;
    comm_in: seconds of communication inside the actions, per rank, traced; traffic: rank -> the
    traced step's record; inter_node_bandwidth: the --inter-node-bandwidth it ran under (summary.json)."""

    run_dir: str
    run: TrainRun
    step: int
    step_s: float
    traced_s: float
    actions: dict[tuple[str, int], float]
    comm_in: dict[int, float]
    traffic: dict[int, dict]
    inter_node_bandwidth: str | None = None


def measured(run_dir: str) -> Measured:
    """The records of a run folder, read.

    Raises:
        ConfigError: the folder is not a run of the built-in trainer, or lacks traffic or trace
            records (the message says which flags to run with).
    """
    runlog.run_folder(run_dir, "project: RUN_DIR", "launcher project runs/mesh-2x2x2 --hardware h100-sxm-8x")
    cfg_path = os.path.join(run_dir, runlog.CONFIG)
    values = runlog.read_config(run_dir)
    if values is None:
        raise ConfigError(f"project: {run_dir} has no config.yaml, so it is not a run of the built-in trainer "
                          f"(project reads its schedule); {FIX.format(mesh='2x2x2')}")
    try:
        run = resolve(config_from_dict({k: v for k, v in values.items() if k not in ("data", "resume")},
                                       source=cfg_path))
    except ConfigError as e:
        raise ConfigError(f"project: {cfg_path}: {e}") from None
    traced = [s for s in traced_steps(run.config) if s > 1]
    traffic = rundir.rank_traffic(run_dir, traced[0], strict=True) if traced else {}
    missing = [what for what, ok in (("trace.json with a traced step after the first", traced),
                                     ("traffic/rank-R.jsonl of that step", len(traffic) == run.mesh.world_size))
               if not ok]
    if missing:
        raise ConfigError(f"project: {run_dir} lacks {' and '.join(missing)}; {FIX.format(mesh=run.mesh)}")
    step = traced[0]
    rows = [r for r in rundir.read_metrics(run_dir, strict=True)
            if isinstance(r.get("step"), int) and isinstance(r.get("step_time_s"), (int, float))]
    trace = runlog.read_trace(run_dir)
    if trace is None:
        raise ConfigError(f"project: {run_dir} lacks {runlog.TRACE}; {FIX.format(mesh=run.mesh)}")
    try:
        return _measured(run_dir, run, step, rows, trace, traffic)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise ConfigError(f"project: {os.path.join(run_dir, runlog.TRACE)}: an event lacks or mistypes a field "
                          f"({type(e).__name__}: {e}); each needs name, ph, ts, dur, tid and args.step, as "
                          f"train/profiling.py writes them; rerun with --trace-steps S") from None


def _measured(run_dir: str, run: TrainRun, step: int, rows: list[dict], trace: list[dict],
              traffic: dict[int, dict]) -> Measured:
    events = [e for e in trace if e.get("ph") == "X" and e["args"].get("step") == step]
    plain = [r["step_time_s"] for r in rows if r["step"] > 1 and r["step"] not in traced_steps(run.config)]
    lengths = [e["dur"] / 1e6 for e in events if e["name"] == f"simcluster:step {step}"]
    if not plain or not lengths:
        raise ConfigError(f"project: {run_dir} needs an untraced step after the first beside the traced one (its "
                          f"steps: {run.config.steps}, traced: {run.config.trace_steps}); {FIX.format(mesh=run.mesh)}")
    acts: dict[tuple[str, int], list[float]] = {}
    comm_in: dict[int, float] = {}
    kinds = {"forward": "F", "backward": "B", "backward-input": "I", "backward-weight": "W"}
    compute = [e for e in events if e.get("cat") == "compute" and e["tid"] < 1000]
    for e in compute:
        word, _, stage = e["name"].split()
        acts.setdefault((kinds[word], int(stage[1:])), []).append(e["dur"] / 1e6)
    for e in events:  # communication on a rank's main track inside one of its actions
        if e["tid"] < 1000 and e["name"].startswith(COMM_EVENTS) and any(
                c["tid"] == e["tid"] and c["ts"] <= e["ts"] <= c["ts"] + c["dur"] for c in compute):
            comm_in[e["tid"]] = comm_in.get(e["tid"], 0.0) + e["dur"] / 1e6
    record = runlog.read_summary(run_dir) or {}
    return Measured(run_dir, run, step, statistics.median(plain), max(lengths),
                    {k: statistics.mean(v) for k, v in acts.items()}, comm_in, traffic,
                    record.get("inter_node_bandwidth"))


def rank_rate(hw: Hardware, world: int) -> float:
    """FLOP/s one rank of a world gets: the device's, or on ``local`` a core's share (a busy core's
    rate, shared_flops, once the ranks fill the cores)."""
    if not hw.shared_cores:
        return hw.flops
    busy = hw.shared_flops or hw.flops
    return (busy if world >= hw.shared_cores > 1 else hw.flops) * min(1.0, hw.shared_cores / world)


@dataclass(frozen=True)
class Projection:
    """The step on one hardware, seconds by part (their sum: total). compute: the slowest pp rank's
    actions without their communication; communication: the collectives inside them plus the
    sends' exposed time; bubble: the window's idle share on that rank; other: the rest."""

    hardware: str
    compute: float
    communication: float
    bubble: float
    other: float

    @property
    def total(self) -> float:
        return self.compute + self.communication + self.bubble + self.other


def project(m: Measured, here: Hardware, target: Hardware) -> tuple[Projection, Projection]:
    """(the measured step on ``here``, split into the parts; the same job projected on ``target``)."""
    run, mesh = m.run, m.run.mesh
    k = m.step_s / m.traced_s  # the profiler's slowdown, taken out of every traced duration
    orders = rank_orders(run.config.schedule, mesh.pp, run.config.microbatches, run.local_stages)
    n_actions = max(len(o) for o in orders)
    speed = rank_rate(here, mesh.world_size) / rank_rate(target, mesh.world_size)
    slow = max(m.traffic, key=lambda r: m.comm_in.get(r, 0.0))
    inside_here = k * m.comm_in.get(slow, 0.0)
    parts_here = comm_parts(slow, m.traffic[slow], mesh, here)
    parts_target = comm_parts(slow, m.traffic[slow], mesh, target)
    model_here = sum(parts_here.get(kind, 0.0) for kind in INSIDE)
    model_target = sum(parts_target.get(kind, 0.0) for kind in INSIDE)
    # the waits measured beyond the model are the shared cores' (a rank waits for its peer's turn on
    # a core): kept where the target shares cores too, dropped on devices with one rank each
    inside_target = model_target + (inside_here - model_here) * (1.0 if target.shared_cores else 0.0)
    per_send = send_bytes(m.traffic[slow])
    rank_of = {st: r for r, order in enumerate(orders) for _, st, _ in order}

    def timeline(hw: Hardware, spd: float, inside: float, with_sends: bool):
        durations = {a: (k * d - inside_here / n_actions) * spd + inside / n_actions for a, d in m.actions.items()}
        transfers = ({(kind, st): send_s(1, per_send, send_pair(kind, st, rank_of, mesh), mesh, hw)
                      for kind, st in m.actions} if with_sends and mesh.pp > 1 else None)
        return simulate(orders, durations, transfers)

    def split(hw: Hardware, spd: float, inside: float, other: float) -> Projection:
        full, free = timeline(hw, spd, inside, True), timeline(hw, spd, inside, False)
        busy = max(free.busy)
        compute = busy - inside
        return Projection(hw.name, compute, inside + (full.window - free.window), free.window - busy, other)

    other_here = m.step_s - timeline(here, 1.0, inside_here, True).window
    return split(here, 1.0, inside_here, other_here), split(target, speed, inside_target, other_here * speed)


def to_text(m: Measured, here: Projection, there: Projection, target: Hardware) -> str:
    """Both steps with their parts, the target's sources and what the projection leaves out."""
    def line(p: Projection) -> str:
        return (f"{p.hardware:>28}: {1e3 * p.total:10.2f} ms = compute {1e3 * p.compute:.2f} + communication "
                f"{1e3 * p.communication:.2f} + bubble {1e3 * p.bubble:.2f} + other {1e3 * p.other:.2f}")
    r = m.run
    out = [f"project {m.run_dir}: {r.mesh} (pp x dp x tp), model {r.config.model}, {r.config.schedule}, "
           f"{r.config.microbatches} microbatches; measured step {1e3 * m.step_s:.2f} ms (traced step {m.step})",
           "  measured here, split: " + line(here).strip(), "  projected:            " + line(there).strip()]
    out += [f"  source: {s}" for s in target.sources]
    if target.ranks_per_node and r.mesh.world_size <= target.ranks_per_node:
        out.append(f"  note: the job's {r.mesh.world_size} ranks fit one node of the target ({target.ranks_per_node} GPUs "
                   f"a node, ranks in order): nothing crosses its network between nodes")
    out.append(f"  left out: {LEFT_OUT}")
    return "\n".join(out)


def to_dict(m: Measured, here: Projection, there: Projection) -> dict:
    """The projection as JSON-able data (seconds)."""
    return {"run_dir": m.run_dir, "mesh": str(m.run.mesh), "traced_step": m.step, "measured_step_s": m.step_s,
            "here": {**dataclasses.asdict(here), "total": here.total},
            "projected": {**dataclasses.asdict(there), "total": there.total}}
