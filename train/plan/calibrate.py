"""The ``local`` hardware model measured: a few seconds of micro-benchmarks on this machine.

    python -m simcluster.train.plan.calibrate        # prints the Hardware it measured (plan caches it)

Measured: one thread's float32 matmul throughput (the trainer's rank runs one intra-op thread)
on a block's shape; one thread's copy bandwidth; gloo's per-message latency and bandwidth between
two processes of this host (4-byte and 4 MiB ping-pongs over loopback TCP). The cores every rank
shares are this process's CPU affinity. Not measured: the Docker bridge between containers (the
across-node numbers are the host's, and --inter-node-bandwidth shaping is not modelled).
"""
from __future__ import annotations

import os
import socket
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


def matmul_flops(m: int = 1024, k: int = 256, n: int = 768) -> float:
    """FLOP/s of one thread's (m, k) @ (k, n) float32 matmul (the small model's w13 on 4 x 256 tokens)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(m, k), torch.randn(k, n)
        return 2 * m * k * n / _timed(lambda: a @ b)
    finally:
        torch.set_num_threads(threads)


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


def gloo_link() -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of one gloo send between two forked processes of this host."""
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        pids = []
        for rank in (0, 1):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    _pingpong(rank, store, out)
                except BaseException:  # noqa: BLE001 - the parent sees the missing result
                    code = 1
                os._exit(code)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        with open(out, encoding="utf-8") as fh:
            small, big = map(float, fh.read().split())
    return small, (1 << 20) * 4 / max(big - small, 1e-9)


def calibrate() -> Hardware:
    """The local Hardware, measured now (a few seconds)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    latency, bandwidth = gloo_link()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    flops = matmul_flops()
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return Hardware("local", flops=flops, bf16_flops=flops, memory=memory, memory_bw=copy_bandwidth(),
                    intra_bw=bandwidth, inter_bw=bandwidth, latency_s=latency, ranks_per_node=0,
                    sources=(f"measured on {socket.gethostname()} at {when} by train/plan/calibrate.py",),
                    shared_cores=cores, node_link=True)


if __name__ == "__main__":
    print(calibrate())
