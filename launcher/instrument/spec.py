"""What to instrument in the ranks of the user's own code, and its one environment contract (stdlib and the stall watch's default).

    python -c "from simcluster.launcher.instrument.spec import Instruments; print(Instruments(traffic=True, trace_steps=(2,)).env())"

The launcher resolves ``--traffic``, ``--trace-steps``, ``--total-steps``, ``--no-cpu-bridges``,
``--no-simulated-gpus``, ``--gpu``, ``--gpu-memory`` and ``--check-devices``
of a script or module job into one frozen ``Instruments``; every engine's document carries it as
the environment below (``engines/document.py node_env``), and each rank reads it back with
``Instruments.from_env`` (``instrument/rank.py``). Step timing is always on; the rest is off by
default except the CPU bridges (``instrument/bridges.py``) and the simulated GPUs (``instrument/gpu/``).

    SIMCLUSTER_TRAFFIC=1          count every communication per step (instrument/traffic.py)
    SIMCLUSTER_TRACE_STEPS=2,3    profile these steps into one Perfetto trace (instrument/trace.py)
    SIMCLUSTER_TOTAL_STEPS=N      the run's steps, for progress and ETA (else the logging API's)
    SIMCLUSTER_CPU_BRIDGES=0      leave torch's CPU-only DTensor gaps unbridged
    SIMCLUSTER_SIMULATED_GPUS=0   no simulated GPU: torch.cuda answers as torch's CPU build does
    SIMCLUSTER_GPU=a100-80g       the simulated GPU's model (default h100-sxm; simcluster/core/hardware.py)
    SIMCLUSTER_GPU_MEMORY=25769803776  the simulated GPU's memory in bytes (--gpu-memory; default the model's)
    SIMCLUSTER_CHECK_DEVICES=1    mixed cuda and CPU tensors, nccl on CPU tensors refused (--check-devices; gpu/devcheck.py)
    TORCH_DISTRIBUTED_DEBUG=DETAIL  --check-collectives 1: torch checks each collective across its group
    SIMCLUSTER_STALL_S=10         the stall watch and communication record (train/stallwatch.py); 0: off (unset: 60)
"""
from __future__ import annotations

from dataclasses import dataclass

from simcluster.core.hang import STALL_DEFAULT_S

ENABLE = "SIMCLUSTER_INSTRUMENT"  # set to "1" by the node wrapper for user code (not the built-in trainer)
OWNER = "SIMCLUSTER_INSTRUMENT_PID"  # the pid that installed them: a child interpreter (spawn) is not a rank
TRAFFIC, TRACE_STEPS, TOTAL_STEPS, CPU_BRIDGES = ("SIMCLUSTER_TRAFFIC", "SIMCLUSTER_TRACE_STEPS",
                                                  "SIMCLUSTER_TOTAL_STEPS", "SIMCLUSTER_CPU_BRIDGES")
SIMULATED_GPUS, GPU, GPU_MEMORY = "SIMCLUSTER_SIMULATED_GPUS", "SIMCLUSTER_GPU", "SIMCLUSTER_GPU_MEMORY"
CHECK_DEVICES = "SIMCLUSTER_CHECK_DEVICES"
DEFAULT_GPU = "h100-sxm"  # the simulated GPU unless --gpu names another (simcluster/core/hardware.py GPU_NAMES)
DEBUG = "TORCH_DISTRIBUTED_DEBUG"  # torch's own: DETAIL checks each collective across its group (--check-collectives 1)
STALL_S = "SIMCLUSTER_STALL_S"  # seconds; unset: STALL_DEFAULT_S (the trainer's own --stall-s default)
BOOT_DIR = "boot"  # beside this file: the folder whose sitecustomize.py starts the instruments in a rank
STEPS_DIR = "steps"  # RUN_DIR/steps/rank-R.jsonl: {"step", "step_time_s", "rss_mb", "time"} per step
WORK_SUFFIX = ".work.json"  # RUN_DIR/steps/rank-R.work.json: {"collectives": N} at the rank's end (instrument/work.py)


@dataclass(frozen=True)
class Instruments:
    """The instruments of a user-code job.

    traffic: count bytes and messages of every communication per step, kind and node link.
    trace_steps: the (1-based) steps each rank profiles with torch.profiler.
    total_steps: the run's step count, for progress and ETA (None: unknown unless logged).
    cpu_bridges: register DTensor sharding strategies torch lacks on CPU (on by default).
    simulated_gpus: each rank sees one GPU of its node, tensors on the CPU (on by default).
    gpu: the simulated GPU's model, a name of simcluster/core/hardware.py's GPU_NAMES.
    gpu_memory: the simulated GPU's memory in bytes (None: the model's; --gpu-memory).
    check_devices: refuse an op mixing cuda and CPU tensors and an nccl collective on a CPU tensor
        (--check-devices; instrument/gpu/devcheck.py).
    stall_s: seconds a rank waits in communication with no rank progressing that end the job as a hang
        (0: off; train/stallwatch.py).
    check_collectives: torch's TORCH_DISTRIBUTED_DEBUG=DETAIL (each collective checked across its group).
    stall_given: --stall-s was given (not its default): an engine whose ranks get no instruments refuses
        it (launcher/engines/checks.py) rather than ignore it; not carried into the ranks.
    gpu_given: --gpu was given: a real cluster's document asks for that model by its own name
        (launcher/engines/gpus.py), or the engine refuses it; not carried into the ranks.
    """

    traffic: bool = False
    trace_steps: tuple[int, ...] = ()
    total_steps: int | None = None
    cpu_bridges: bool = True
    simulated_gpus: bool = True
    gpu: str = DEFAULT_GPU
    gpu_memory: int | None = None
    check_devices: bool = False
    stall_s: float = STALL_DEFAULT_S
    check_collectives: bool = False
    stall_given: bool = False
    gpu_given: bool = False

    def env(self) -> dict[str, str]:
        """The environment variables that carry these instruments (only those not at their default)."""
        out = {}
        if self.traffic:
            out[TRAFFIC] = "1"
        if self.trace_steps:
            out[TRACE_STEPS] = ",".join(map(str, self.trace_steps))
        if self.total_steps:
            out[TOTAL_STEPS] = str(self.total_steps)
        if not self.cpu_bridges:
            out[CPU_BRIDGES] = "0"
        if not self.simulated_gpus:
            out[SIMULATED_GPUS] = "0"
        if self.gpu != DEFAULT_GPU:
            out[GPU] = self.gpu
        if self.gpu_memory:
            out[GPU_MEMORY] = str(self.gpu_memory)
        if self.check_devices:
            out[CHECK_DEVICES] = "1"
        if self.check_collectives:
            out[DEBUG] = "DETAIL"
        if self.stall_s != STALL_DEFAULT_S:
            out[STALL_S] = f"{self.stall_s:g}"
        return out

    @classmethod
    def from_env(cls, env) -> "Instruments":
        """The instruments an environment (``os.environ``) names; malformed values count as unset."""
        steps = tuple(int(s) for s in env.get(TRACE_STEPS, "").split(",") if s.strip().isdigit())
        total = env.get(TOTAL_STEPS, "")
        return cls(traffic=env.get(TRAFFIC) == "1", trace_steps=steps,
                   total_steps=int(total) if total.isdigit() and int(total) > 0 else None,
                   cpu_bridges=env.get(CPU_BRIDGES) != "0", simulated_gpus=env.get(SIMULATED_GPUS) != "0",
                   gpu=env.get(GPU) or DEFAULT_GPU, stall_s=_seconds(env.get(STALL_S)),
                   gpu_memory=int(env[GPU_MEMORY]) if env.get(GPU_MEMORY, "").isdigit() else None,
                   check_collectives=env.get(DEBUG) == "DETAIL", check_devices=env.get(CHECK_DEVICES) == "1")


def _seconds(text: str | None) -> float:
    """The stall limit of SIMCLUSTER_STALL_S: the default when unset, 0 (off) when malformed."""
    if text is None:
        return STALL_DEFAULT_S
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if 0 < value < float("inf") else 0.0
