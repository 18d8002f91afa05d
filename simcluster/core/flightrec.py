"""torch's Flight Recorder on a real cluster: the environment that makes each rank dump its record on a
collective's timeout into the run folder (the contract the generated jobs and the reader share).

    python -c "from simcluster.core.flightrec import dump_env; print(dump_env('runs/job'))"

``dump_env`` is the one home of that environment (the Slurm, JobSet, TrainJob and SkyPilot documents
call it): ``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries kept per process (torch's Flight Recorder reads it,
or ``TORCH_FR_BUFFER_SIZE``), ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` (the NCCL watchdog dumps on a
collective's timeout or error), ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` the path prefix torch appends the
global rank to (``RUN_DIR/flight-recorder/nccl_trace_rank_``; torch's default is the node's own
~/.cache/torch, lost with the node), ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` how long the watchdog
waits for the dump before it tears the process down (torch's default 15 s), and a heartbeat timeout
(``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``) longer than that wait, so the monitor thread never kills a rank
that is still dumping. Reading the dumps: train/flightrec.py.
"""
from __future__ import annotations

DUMP_DIR = "flight-recorder"  # in the run folder
FILE_PREFIX = "nccl_trace_rank_"  # torch's own default name; torch appends the global rank
BUFFER_ENTRIES = 2000  # torch's default: the last 2000 calls of each rank
DUMP_WAIT_MS = 60_000  # the dump's time before the rank is torn down (torch's default 15 s)
HEARTBEAT_S = 600  # longer than the dump's wait (torch's default 480 s)
PREFIX_KEYS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # torch reads the first set
SIZE_KEYS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch 2.13 reads the first one set (tried with
# both given: the first counts); the second is its older name, which a real cluster's older torch reads alone
FIX = ("give the folder of one job's dumps: RUN_DIR/flight-recorder, written with TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
       "and TORCH_NCCL_DEBUG_INFO_TEMP_FILE=RUN_DIR/flight-recorder/nccl_trace_rank_ (generate --target slurm|jobset|"
       "trainjob sets both)")


def dump_prefix(run_dir: str) -> str:
    """The path prefix of a run's dumps: RUN_DIR/flight-recorder/nccl_trace_rank_ (torch adds the rank)."""
    return f"{run_dir.rstrip('/')}/{DUMP_DIR}/{FILE_PREFIX}"


def dump_env(run_dir: str) -> dict[str, str]:
    """The environment that turns the Flight Recorder's dump on timeout on, into run_dir (as the
    ranks see it: an absolute path on the nodes, or one relative to their working folder)."""
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(BUFFER_ENTRIES), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_prefix(run_dir), "TORCH_NCCL_ENABLE_MONITORING": "1",
            "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": str(DUMP_WAIT_MS), "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(HEARTBEAT_S)}


TORCH_ENTRIES = 2000  # torch's own default of TORCH_FR_BUFFER_SIZE
ENTRIES_PER_WORLD = 128_000  # a rehearsal beyond 64 ranks keeps this many entries over the world's ranks
LEAST_ENTRIES = 250  # never fewer: the stall watch's snapshot keeps a group's last 24 (train/commrecord.py KEEP)


def rehearsal_entries(world: int) -> int:
    """TORCH_FR_BUFFER_SIZE's default in a rehearsal's ranks (a user's own setting wins): torch's 2000
    up to 64 ranks, then ENTRIES_PER_WORLD / world, at least LEAST_ENTRIES (250 at 512 ranks). An entry
    holds its call's Python stack: 2000 of them grew a rank by 3.3 MB (BENCHMARKS.md), 1.7 GB at 512 ranks on a
    24 GB machine that pages past about 21 GB; the snapshot at a hang needs only the newest."""
    return max(LEAST_ENTRIES, min(TORCH_ENTRIES, ENTRIES_PER_WORLD // max(world, 1)))
