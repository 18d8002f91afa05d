"""The ``local`` hardware model measured: a few seconds of micro-benchmarks on this machine.

    python -m simcluster.train.plan.calibrate        # prints the Hardware it measured (plan caches it)

Measured: one thread's float32 throughput (the trainer's rank runs one intra-op thread) on the
trainer's own blocks (two blocks of the small model, forward and backward at 4 x 256 tokens, the
FLOPs as torch's FlopCounterMode counts them: the kernels' efficiency on those shapes, not a
bare matmul's), alone and in one process a core at once; one thread's copy bandwidth; gloo's per-message latency and bandwidth between
two processes of this host (4-byte and 4 MiB ping-pongs over loopback TCP), alone and beside
3 x cores busy processes (ranks outnumbering the cores, as 8 ranks on 2: a message waits for its
peer's turn on a core). The cores every rank shares are this process's CPU affinity. Not measured: the Docker
bridge between containers (the across-node numbers are the host's; --inter-node-bandwidth is
hardware.shaped).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from simcluster.train.plan.hardware import Hardware


def _timed(fn, min_s: float = 0.3) -> float:
    """Seconds per call of fn, over at least min_s after one warm-up call."""
    fn()
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_s:
        fn()
        n += 1
    return elapsed / n


def block_flops(seconds: float = 0.6, processes: int = 1) -> float:
    """FLOP/s of one thread running two small-model blocks forward and backward (4 x 256 tokens);
    with ``processes`` > 1, the mean of that many fresh interpreters running it at once (every
    core busy: they share the memory bandwidth and caches, as the ranks of a job do). Fresh
    interpreters, not forks: a fork of a process whose OpenMP pool has run can hang in its first
    parallel region."""
    if processes > 1:
        return _concurrent_mean(seconds, processes)
    import dataclasses

    from torch.utils.flop_counter import FlopCounterMode

    from simcluster.train.config import PRESETS
    from simcluster.train.model import build_model, loss_fn

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(PRESETS["small"], n_layers=2))
        tokens = torch.randint(0, 256, (4, 256))

        def step():
            loss_fn(model(tokens), tokens).backward()

        with FlopCounterMode(display=False) as counter:
            step()
        if os.environ.get(_READY):  # a child of _concurrent_mean: warm, wait for the others
            print("ready", flush=True)
            sys.stdin.readline()
        return counter.get_total_flops() / _timed(step, seconds)
    finally:
        torch.set_num_threads(threads)


_READY = "SIMCLUSTER_CALIBRATE_READY"


def _concurrent_mean(seconds: float, processes: int) -> float:
    """block_flops in ``processes`` fresh interpreters, started together once all are warm."""
    code = f"from simcluster.train.plan.calibrate import block_flops; print(block_flops({seconds!r}))"
    env = {**os.environ, _READY: "1", "OMP_NUM_THREADS": "1"}
    children = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env) for _ in range(processes)]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("calibration: a benchmark process ended before it was ready")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        values = [float(child.communicate(timeout=120)[0].split()[-1]) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    return sum(values) / len(values)


def copy_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes/s one thread reads plus writes copying a float32 buffer."""
    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / _timed(lambda: dst.copy_(src))


def _pingpong(rank: int, store_path: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    results = []
    for numel, reps in ((1, 200), (1 << 20, 10)):
        t = torch.zeros(numel)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
        results.append((time.perf_counter() - t0) / (2 * reps))
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as fh:
            fh.write(" ".join(map(str, results)))
    dist.destroy_process_group()


def _spin() -> None:
    """Keep a core busy (pure Python: a forked child must not touch torch's OpenMP pool)."""
    while True:
        pass


def gloo_link(busy: int = 0) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of one gloo send between two forked processes of this host,
    beside ``busy`` processes that keep the cores busy."""
    spinners = []
    for _ in range(busy):
        pid = os.fork()
        if pid == 0:
            _spin()
        spinners.append(pid)
    try:
        return _pingpong_pair()
    finally:
        for pid in spinners:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _pingpong_pair() -> tuple[float, float]:
    """The two ping-pong ranks in fresh interpreters (not forks; see block_flops)."""
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        code = "import sys; from simcluster.train.plan.calibrate import _pingpong; _pingpong(int(sys.argv[1]), *sys.argv[2:])"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank), store, out], env=env) for rank in (0, 1)]
        for child in ranks:
            child.wait(timeout=120)
        if not os.path.isfile(out):
            raise RuntimeError("calibration: the gloo ping-pong between two processes failed")
        with open(out, encoding="utf-8") as fh:
            small, big = map(float, fh.read().split())
    return small, (1 << 20) * 4 / max(big - small, 1e-9)


def calibrate() -> Hardware:
    """The local Hardware, measured now (about 20 s on 2 cores: fresh interpreters for the
    concurrent benchmarks)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    latency, bandwidth = gloo_link()
    shared_latency = gloo_link(busy=3 * cores)[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    flops = block_flops()
    shared_flops = block_flops(processes=cores) if cores > 1 else flops
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return Hardware("local", flops=flops, bf16_flops=flops, memory=memory, memory_bw=copy_bandwidth(),
                    intra_bw=bandwidth, inter_bw=bandwidth, latency_s=latency, ranks_per_node=0,
                    sources=(f"measured on {socket.gethostname()} at {when} by train/plan/calibrate.py",),
                    shared_cores=cores, node_link=True, shared_latency_s=shared_latency,
                    shared_flops=shared_flops)


if __name__ == "__main__":
    print(calibrate())
