"""Process-level settings of a training process: the C allocator and Python's garbage collector.

    python -c "from simcluster.train.runtime import tune_malloc; print(tune_malloc())"

Both are applied the same way to the mesh's ranks (``train.trainer``) and to the one-process
reference (``train.reference``), so the throughput benchmark compares like with like.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

# glibc mallopt(3) parameters. A training step frees and reallocates the same activation and
# gradient buffers (0.1-30 MB here) every microbatch. With glibc's defaults, blocks over the
# dynamic mmap threshold are mmap'd and munmap'd each time, and a freed heap top is trimmed back
# to the kernel: each reuse then page-faults its memory in again, zeroed. Serving them from a heap
# that is kept removes that kernel work (measured on 2x2x2 small: see BENCHMARKS.md).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MALLOC_SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 64 << 20}
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def tune_malloc() -> bool:
    """Keep freed memory in glibc's heap: mmap threshold 32 MiB (glibc's maximum on 64-bit),
    trim threshold 1 GiB, top pad 64 MiB, set with ``mallopt(3)``.

    Peak RSS is unchanged (the heap keeps what the step's peak needed anyway). Returns False,
    changing nothing, where libc is not glibc or the user set any of ``MALLOC_ENV`` (their
    settings win).
    """
    if any(k in os.environ for k in MALLOC_ENV):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
        return False
    applied = [mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS.items()]  # each one, even after a refusal
    return all(applied)


def freeze_imports() -> None:
    """Move every object alive now (the imported modules, before any model exists) into the
    collector's permanent generation, once per process: no later collection walks them (a full
    ``gc.collect()`` of torch's ~300k objects costs a rank about 0.1-0.3 s of CPU, and in a forked
    rank it writes to the pages it shares with its node's other ranks). The objects made after
    (the model, the process groups) stay collectable. train/forkrun.py freezes its
    imports before forking the ranks; this does the same in a fresh interpreter (stock torchrun)."""
    gc.freeze()


class GarbageCollection:
    """Python's cyclic collector off during training, run every ``every`` steps instead (as
    torchtitan's ``training.gc_freq``): automatic collections fire on allocation counts, mid-step,
    on every rank at a different moment. Generation 1 only: the long-lived model objects (in
    generation 2) and the imports (frozen: ``freeze_imports``) are not rescanned.

    Use as a context manager around the loop and call ``step(step)`` after each step; ``every``
    0 leaves the collector alone. Restores the collector's previous state on exit.
    """

    def __init__(self, every: int):
        self.every, self.was_enabled = every, gc.isenabled()

    def __enter__(self) -> "GarbageCollection":
        if self.every:
            gc.collect(1)
            gc.disable()
        return self

    def step(self, step: int) -> None:
        """Collect generation 1 when ``step`` is a multiple of ``every``."""
        if self.every and step % self.every == 0:
            gc.collect(1)

    def __exit__(self, *exc) -> None:
        if self.every and self.was_enabled:
            gc.enable()


PR_SET_NAME = 15  # prctl(2): the calling thread's name, at most 15 bytes (what /proc/PID/task/TID/comm shows)


def name_thread(name: str) -> bool:
    """Give the calling OS thread ``name`` (cut to 15 bytes) so that its CPU time can be read per
    thread from /proc (bench/rank_cost.py reads the stall watch's, ``sc-stallwatch``); False where
    there is no prctl (not Linux), changing nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
