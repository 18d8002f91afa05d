"""The measured side: one rank of the real trainer on torch's fake process group, in a forked child,
with the traffic accounting on (and optionally torch's MemTracker) around its steps.

    python -m simcluster.train.plan.measure --mesh 2x2x2 --model tiny --schedule zbv [--memory]   # a JSON line per rank

The fake process group (``torch.testing._internal.distributed.fake_pg``) runs one rank alone: every
collective and send/recv is dispatched as in a real run (so ``train.traffic.TrafficMode`` records
exactly what it records under gloo) but moves no data, so the numbers are garbage and only the
shapes and the op sequence are real. One exception is patched: the schedule's warm-up vote
(whether the stages' shapes are static) reads the received vote, which the fake group leaves at
0; the patched vote still sends and receives, then answers STATIC, as every rank of a real run
of the trainer does (its stage I/O shapes are given, train/pipeline.py stage_io). Each rank runs
in a child forked from this process, so no rank sees another's process group or caches.

For the step's CPU (stage_overhead) a child also holds, idle, one gloo process group for each
group its rank holds on the cluster (the world and each DeviceMesh dimension's that is not the
world: 4 on 2x2x2): gloo's TCP device keeps an event-loop thread per group that wakes every 10 ms
(``epoll_wait``'s timeout in gloo/transport/tcp/loop.cc), about 400 wake-ups a second for 4 groups,
and on cores the ranks outnumber, each wake-up takes a core from some rank's compute.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.testing._internal.distributed.fake_pg import FakeStore

from simcluster.core.config import TrainRun
from simcluster.core.hardware import Hardware
from simcluster.train.plan.predict import Plan


def _static_vote(orig):
    def vote(self, received_result=None):
        orig(self, received_result)
        return torch.ones(1, dtype=torch.int32)
    return vote


def idle_gloo_groups(mesh) -> list:
    """One idle one-rank gloo process group (``ProcessGroupGloo`` on a HashStore) for each distinct
    group a rank of the DeviceMesh ``mesh`` holds (the world's and its dimensions'): their
    event-loop threads wake as a cluster rank's do. Held by the caller for as long as they should run."""
    from datetime import timedelta

    groups = {id(g) for g in [dist.group.WORLD, *(mesh.get_group(d) for d in range(mesh.ndim))]}
    return [dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60)) for _ in groups]


def _child(run: TrainRun, rank: int, steps: int, memory: bool, idle_groups: bool = False) -> dict:
    from simcluster.train.trainer import Trainer

    PipelineStage._warmup_backward_result = _static_vote(PipelineStage._warmup_backward_result)
    torch.set_num_threads(1)
    # The fake group's receives leave their buffers as allocated: garbage, often denormal floats,
    # on which a CPU's float units run 5-10x slower (a 2x2x2 small last stage: 2.7 core-s a step
    # against 0.45 with this set). Flushed to zero, a rank's CPU time is its real work's.
    torch.set_flush_denormal(True)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=run.mesh.world_size)
    trainer = Trainer(run, rank, 0)
    idle = idle_gloo_groups(trainer.mesh) if idle_groups else []  # noqa: F841 - held through the steps
    out: dict = {"rank": rank, "traffic": [], "step_s": [], "cpu_s": []}
    for step in range(1, steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        if memory and step == steps:
            out["memory"] = _tracked_step(trainer, step)
        else:
            trainer.train_step(step)
        out["step_s"].append(time.perf_counter() - t0)
        out["cpu_s"].append(time.process_time() - c0)
        if trainer.traffic is not None:
            with open(trainer.traffic_log.path, encoding="utf-8") as fh:
                out["traffic"] = [json.loads(line) for line in fh]
    out["held"] = held_bytes(trainer)
    return out


def held_bytes(trainer) -> dict[str, int]:
    """{"params", "grads", "optimizer"}: bytes of the local tensors the rank's modules and AdamW
    hold now (after a step: grads set to None by zero_grad are taken from the optimizer state's
    shapes, one per parameter)."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    params = [local(p) for p in trainer.params]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    opt = sum(local(v).numel() * local(v).element_size() for o, _ in trainer.optims for st in o.state.values()
              for v in st.values() if isinstance(v, torch.Tensor))
    grads = sum(local(st["exp_avg"]).numel() * local(st["exp_avg"]).element_size()
                for o, _ in trainer.optims for st in o.state.values())
    return {"params": nbytes, "grads": grads, "optimizer": opt}  # (gathered: MemTracker's PARAM - params)


def _tracked_step(trainer, step: int) -> dict:
    """MemTracker's peak snapshot of one step: {"PARAM", "GRAD", "ACT", "TEMP", "OPT", ..., "Total"} bytes.

    MemTracker refuses a root module's second forward in one tracked region ("multiple iterative
    calls"), which every microbatch after the first is; each stage module's entry is dropped
    before its next forward, so it starts fresh (the device-wide peak, what is read here, is kept).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    roots = set(trainer.pipe.modules)
    pre = tracker._pre_fw_hook

    def pre_fw(module, inputs):
        if module in roots and not tracker._mod_tracker.is_bw:
            tracker.memory_tracking.pop(module, None)
        return pre(module, inputs)

    tracker._pre_fw_hook = pre_fw
    tracker.track_external(*trainer.pipe.modules, *[o for o, _ in trainer.optims])
    with tracker:
        trainer.train_step(step)
    peak = tracker.get_tracker_snapshot("peak")
    dev = next(iter(peak))
    return {k.name if hasattr(k, "name") else str(k): int(v) for k, v in peak[dev].items()}


def _fork(run: TrainRun, rank: int, steps: int, memory: bool, quiet: bool = False,
          idle_groups: bool = False) -> tuple[int, int]:
    """Fork the child of one rank (quiet: its stdout and stderr to /dev/null; a failure still comes
    back through the pipe); returns (its pid, the read end of its pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        if quiet:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
        code = 0
        try:
            payload = json.dumps(_child(run, rank, steps, memory, idle_groups))
        except BaseException:  # noqa: BLE001 - reported to the parent
            payload, code = json.dumps({"error": traceback.format_exc()}), 1
        with os.fdopen(w, "w") as fh:
            fh.write(payload)
        os._exit(code)
    os.close(w)
    return pid, r


def _collect(run: TrainRun, rank: int, pid: int, r: int) -> dict:
    with os.fdopen(r) as fh:
        data = json.loads(fh.read() or '{"error": "no output"}')
    os.waitpid(pid, 0)
    if "error" in data:
        raise RuntimeError(f"rank {rank} of {run.mesh} {run.config.schedule}: {data['error']}")
    return data


def measure_ranks(run: TrainRun, ranks: list[int] | None = None, steps: int = 2, memory: bool = False,
                  jobs: int = 2, quiet: bool = False, idle_groups: bool = False) -> list[dict]:
    """For each rank (default all): {"rank", "traffic": the accounting's rows (one per step; run
    with traffic=1), "held": held_bytes, "memory": MemTracker's peak snapshot of the last step
    (memory=True), "step_s" and "cpu_s": each step's wall and process CPU seconds (alone on one
    thread, the collectives moving nothing)}, each from a forked child, ``jobs`` at a time (quiet:
    their output dropped; idle_groups: each child holding idle_gloo_groups). run.config.run_dir gets
    the traffic files.

    Raises:
        RuntimeError: a child failed (its traceback in the message).
    """
    ranks = list(range(run.mesh.world_size)) if ranks is None else list(ranks)
    out = []
    for i in range(0, len(ranks), jobs):
        started = [(rank, *_fork(run, rank, steps, memory, quiet, idle_groups)) for rank in ranks[i:i + jobs]]
        out += [_collect(run, rank, pid, r) for rank, pid, r in started]
    return out


AT_ONCE_PER_CORE = 8  # stage_overhead's most children a core: 16 here (4x2x2's ranks), not 256 for a 16x8x2 plan


def stage_overhead(p: Plan, flops_per_s: float, cores: int, steps: int = 5) -> tuple[float, ...]:
    """Per pp rank of the plan, the CPU a step of its work takes against its FLOPs at ``flops_per_s``
    (1.0: the FLOP model is right; above: DTensor's dispatch, FSDP's copies, the schedule's runtime
    and the rest of what is not FLOPs). Measured on the first rank of each pp stage (its dp x tp peers do
    alike) alone on the fake process group, on one thread, traffic accounting off, holding its
    cluster rank's gloo groups idle (idle_gloo_groups: their event loops wake as there), as many
    children at once as the job has ranks (copies of the same ranks, at most AT_ONCE_PER_CORE a
    core: the cores time-sliced as on the cluster, sharing caches and memory bandwidth; a 1-rank
    job alone, as its rank runs beside idle cores, which these cores' shared caches make up to
    20% faster than with every core busy); each rank's mean over its copies of their median over
    the steps after the first (which fills DTensor's caches). About 5 s a pp stage for the small
    model here. ``cores`` bounds the children at once only.

    Raises:
        RuntimeError: a child failed (its traceback in the message).
    """
    import tempfile

    run = p.run
    firsts = [pp * run.mesh.ranks_per_node for pp in range(run.mesh.pp)]
    at_once = min(run.mesh.world_size, AT_ONCE_PER_CORE * cores)
    batch = [firsts[i % len(firsts)] for i in range(-(-len(firsts) // at_once) * at_once)]
    with tempfile.TemporaryDirectory(prefix="simcluster-overhead-") as tmp:
        alone = dataclasses.replace(run, config=dataclasses.replace(run.config, traffic=0, run_dir=tmp))
        rows = measure_ranks(alone, batch, steps=steps, jobs=at_once, quiet=True, idle_groups=True)
    cpu: dict[int, list[float]] = {}
    for row in rows:
        cpu.setdefault(row["rank"], []).append(statistics.median(row["cpu_s"][1:] or row["cpu_s"]))
    return tuple(statistics.mean(cpu[r]) / (p.ranks[r].flops / flops_per_s) for r in firsts)


def overhead_for(p: Plan, hw: Hardware) -> tuple[float, ...] | None:
    """stage_overhead of a plan on hardware whose ranks share this machine's cores (``local``); None
    on a GPU target, whose kernels do not pay this CPU's dispatch (its FLOP model stands)."""
    return stage_overhead(p, hw.flops, hw.shared_cores) if hw.shared_cores else None


def main(argv: list[str] | None = None) -> int:
    from simcluster.core.flags import add_config_args, config_from_args
    from simcluster.train.preflight import preflight

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_args(p)
    p.add_argument("--memory", action="store_true", help="MemTracker around the last step")
    args = p.parse_args(argv)
    run = preflight(dataclasses.replace(config_from_args(args), traffic=1))
    for row in measure_ranks(run, memory=args.memory):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
