"""The instruments of one rank of the user's code: installed by boot/sitecustomize.py (or, in a forked
rank, train/forked_rank.py) before it runs.

    SIMCLUSTER_INSTRUMENT=1 RANK=0 SIMCLUSTER_OUTPUT_DIR=/tmp/r PYTHONPATH=launcher/instrument/boot python examples/ddp.py

``install`` reads the job's instruments from the environment (instrument/spec.py), makes this
rank's step clock (instrument/clock.py) and, once the user's code imports torch (never before:
instrument/lazy.py), registers the clock as torch's global optimizer-step hook, pushes the
traffic mode (``--traffic 1``), starts the profiler of a traced first step (``--trace-steps``)
and, once ``torch.distributed.tensor`` is imported, the CPU bridges (on unless
``--no-cpu-bridges``; FSDP2's gradient divide factor on gloo too: instrument/fsdp_gloo.py; FlexAttention's backward:
instrument/flex_cpu.py; compiled activation checkpointing's CPU RNG states: instrument/compile_rng.py); with torch, first of all, the simulated GPU (instrument/gpu/, on unless
``--no-simulated-gpus``), and, once ``torch.distributed`` is imported, the stall watch and the
communication record (``--stall-s``, train/stallwatch.py). Outside a rank of the cluster (no SIMCLUSTER_OUTPUT_DIR) nothing is written.
"""
from __future__ import annotations

import os
import sys

from simcluster.launcher.instrument.clock import Clock
from simcluster.launcher.instrument.lazy import when_imported
from simcluster.launcher.instrument.spec import ENABLE, OWNER, Instruments
from simcluster.core.layout import node_of

CLOCK: Clock | None = None  # this rank's clock, once installed (simcluster.step and simcluster.log use it)


def _warn(what: str, e: Exception) -> None:
    print(f"[simcluster] {what} not installed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def boot(env=os.environ) -> None:
    """Install the instruments in this process if it is a rank of the user's code: ENABLE is "1",
    RANK is set, and no other process claimed them (OWNER holds the pid that did; an interpreter
    a rank starts itself inherits it and is not a rank). Never raises: an instrument that fails
    prints one line and the user's code runs without it. Called by boot/sitecustomize.py in a
    fresh interpreter and by train/forked_rank.py in a forked rank."""
    if env.get(ENABLE) != "1" or "RANK" not in env:
        return
    owner = env.get(OWNER)
    if owner and owner != str(os.getpid()):
        return
    env[OWNER] = str(os.getpid())
    try:
        install(env)
    except Exception as e:  # noqa: BLE001 - an instrument must never stop the user's code
        _warn("instruments", e)


def install(env=os.environ) -> Clock:
    """Install this rank's instruments (idempotent); returns its clock."""
    global CLOCK
    if CLOCK is not None:
        return CLOCK
    inst = Instruments.from_env(env)
    rank, out_dir = int(env.get("RANK", "0")), env.get("SIMCLUSTER_OUTPUT_DIR")
    per_node = int(env.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's: the ranks of this node
    CLOCK = Clock(out_dir, rank)
    if out_dir:
        try:
            from simcluster.launcher.instrument.work import install as count_work
            count_work(out_dir, rank)
        except Exception as e:  # noqa: BLE001 - an instrument must never stop the user's code
            _warn("collective count", e)
    when_imported("torch", lambda torch: _on_torch(torch, inst, rank, per_node, out_dir, env))
    if inst.stall_s and out_dir:
        when_imported("torch.distributed", lambda _m: _guarded("stall watch", _stall_watch, inst.stall_s, out_dir, rank))
    if inst.cpu_bridges:
        _bridges()
    return CLOCK


def _guarded(what: str, fn, *args) -> None:
    """``fn(*args)``; an exception prints one line naming ``what`` (the user's code goes on)."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - an instrument must never stop the user's code
        _warn(what, e)


def _stall_watch(stall_s, out_dir, rank) -> None:
    from simcluster.train.commrecord import skip_frames_under
    from simcluster.train.stallwatch import start
    skip_frames_under(os.path.dirname(os.path.abspath(__file__)))  # these instruments: not a caller to name
    start(stall_s, out_dir, rank)


def _simulate(torch, per_node: int, gpu: str, gpu_memory: int | None, check_devices: bool = False) -> None:
    from simcluster.launcher.instrument.gpu.install import install as simulate
    simulate(torch, per_node, gpu, gpu_memory, check_devices)
    from simcluster.launcher.instrument.gpu.memory import peak_record
    CLOCK.fields.append(peak_record)


def _on_torch(torch, inst, rank: int, per_node: int, out_dir, env) -> None:
    """Once torch is imported: the simulated GPU first, the step clock's hook, traffic, trace."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if inst.simulated_gpus:
        _guarded("simulated GPUs", _simulate, torch, per_node, inst.gpu, inst.gpu_memory, inst.check_devices)
    register_optimizer_step_post_hook(CLOCK.on_optimizer_step)
    if out_dir and inst.traffic:
        def traffic():
            from simcluster.launcher.instrument.traffic import TrafficListener
            CLOCK.listeners.append(TrafficListener(out_dir, rank, per_node, CLOCK.restart, env))
        _guarded("traffic accounting", traffic)
    if out_dir and inst.trace_steps:
        from simcluster.launcher.instrument.trace import TraceListener
        CLOCK.listeners.append(TraceListener(out_dir, rank, node_of(rank, per_node), inst.trace_steps))


def _flex(flex) -> None:
    from simcluster.launcher.instrument.flex_cpu import install as bridge
    bridge(flex)


def _dtensor(_mod) -> None:
    from simcluster.launcher.instrument.bridges import install as bridge
    bridge()


def _fsdp(collectives) -> None:
    from simcluster.launcher.instrument.fsdp_gloo import install as bridge
    bridge(collectives)


def _compile_rng(_mod) -> None:
    from simcluster.launcher.instrument.compile_rng import install as bridge
    bridge()


def _bridges() -> None:
    """The CPU bridges, each once its torch module is imported."""
    when_imported("torch._functorch.partitioners", lambda m: _guarded("compiled checkpointing CPU bridge", _compile_rng, m))
    when_imported("torch.nn.attention.flex_attention", lambda m: _guarded("FlexAttention CPU bridge", _flex, m))
    when_imported("torch.distributed.tensor", lambda m: _guarded("CPU bridges", _dtensor, m))
    when_imported("torch.distributed.fsdp._fully_shard._fsdp_collectives",
                  lambda m: _guarded("FSDP2 gloo bridge", _fsdp, m))
