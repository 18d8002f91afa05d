"""The ``local`` hardware model measured: about 25 s of micro-benchmarks on this machine.

    python -m simcluster.train.plan.calibrate        # prints the Hardware it measured (plan caches it)

Measured: one thread's float32 throughput (the trainer's rank runs one intra-op thread) on the
trainer's own blocks (two blocks of the small model, forward and backward at 4 x 256 tokens, the
FLOPs as torch's FlopCounterMode counts them with train/plan/flops.py's mapping, attention
included: the kernels' efficiency on those shapes, not a bare matmul's), alone and in one process a core at once; one thread's copy bandwidth; gloo's
per-message latency and bandwidth between two processes of this host (4-byte and 4 MiB
ping-pongs over loopback TCP), alone and beside 3 x cores busy processes (ranks outnumbering the
cores, as 8 ranks on 2: a message waits for its peer's turn on a core); the CPU a rank spends in
each collective kind inside an action, per call and per byte, in groups of 2, 4 and 8 among
4 x cores ranks. The gloo ranks are forked from one fresh interpreter, as the cluster's are
(train/forkrun.py). The cores every rank shares are this process's CPU affinity.
Not measured: the Docker bridge between containers (the across-node numbers are the host's;
--inter-node-bandwidth is hardware.shaped).
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

from simcluster.core.hardware import Hardware
from simcluster.train.plan.steptime import INSIDE


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

    from simcluster.core.config import PRESETS
    from simcluster.train.model import build_model, loss_fn
    from simcluster.train.plan.flops import counter_mapping

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(PRESETS["small"], n_layers=2))
        tokens = torch.randint(0, 256, (4, 256))

        def step():
            loss_fn(model(tokens), tokens).backward()

        with FlopCounterMode(display=False, custom_mapping=counter_mapping()) as counter:
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


def _pingpong(rank: int, world: int, store_path: str, out_path: str) -> None:
    """One of the two ping-pong ranks: rank 0 writes its seconds a one-way message of 4 bytes and of 4 MiB."""
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
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


def _fork_ranks(target: str, world: int, busy: int, *args: str) -> None:
    """In a fresh interpreter that has imported torch and run no op: fork ``busy`` spinners and
    ``world`` ranks running ``target(rank, world, *args)``; exits 1 when a rank failed. Forks share
    the one import (8 fresh interpreters would spend seconds of CPU each importing torch, and
    beside busy cores many more); a fork is safe here, before any OpenMP pool has run."""
    spinners = []
    for _ in range(busy):
        if (pid := os.fork()) == 0:
            _spin()
        spinners.append(pid)
    ranks = []
    for rank in range(world):
        if (pid := os.fork()) == 0:
            code = 1
            try:
                torch.set_num_threads(1)
                globals()[target](rank, world, *args)
                code = 0
            finally:
                os._exit(code)
        ranks.append(pid)
    failed = [rank for rank, pid in enumerate(ranks) if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
    for pid in spinners:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    sys.exit(1 if failed else 0)


def _run_ranks(target: str, world: int, tmp: str, busy: int = 0) -> str:
    """The path in tmp that ``world`` ranks of ``target`` wrote their results to (_fork_ranks),
    run beside ``busy`` spinners.

    Raises:
        RuntimeError: a rank failed.
    """
    store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
    code = "import sys; from simcluster.train.plan.calibrate import _fork_ranks; _fork_ranks(sys.argv[1], *map(int, sys.argv[2:4]), *sys.argv[4:])"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code, target, str(world), str(busy), store, out], env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"calibration: the gloo benchmark {target} between {world} processes failed")
    return out


def gloo_link(busy: int = 0) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of one gloo send between two processes of this host (_pingpong),
    beside ``busy`` processes that keep the cores busy."""
    with tempfile.TemporaryDirectory() as tmp:
        out = _run_ranks("_pingpong", 2, tmp, busy)
        with open(out, encoding="utf-8") as fh:
            small, big = map(float, fh.read().split())
    return small, (1 << 20) * 4 / max(big - small, 1e-9)


# a collective's bytes a call (the accounting's: an all-reduce's or reduce-scatter's input, an
# all-gather's shard), two sizes spanning the trainer's (the small model's 0.35-4 MiB)
COLLECTIVE_SIZES = (512 << 10, 4 << 20)


def _collective(kind: str, nbytes: int, group, k: int):
    """A call of one kind of the trainer's collectives on ``nbytes`` (the accounting's convention)."""
    numel = nbytes // 4
    if kind == "tp_all_reduce":
        t = torch.ones(numel)
        return lambda: dist.all_reduce(t, group=group)
    if kind == "fsdp_all_gather":
        shard, full = torch.ones(numel), torch.empty(numel * k)
        return lambda: dist.all_gather_into_tensor(full, shard, group=group)
    whole, shard = torch.ones(numel - numel % k), torch.empty(numel // k)
    return lambda: dist.reduce_scatter_tensor(shard, whole, group=group)


def _collectives(rank: int, world: int, store_path: str, out_path: str) -> None:
    """One of ``world`` processes: for each group size k (2, 4, ... <= world) the world split into
    groups of k (``new_subgroups``), every group running each kind at each size at once; writes
    this rank's CPU seconds a call as "kind k nbytes seconds" lines."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    lines, k = [], 2
    while k <= world:
        group, _ = dist.new_subgroups(group_size=k)
        for kind in INSIDE:
            for nbytes in COLLECTIVE_SIZES:
                call = _collective(kind, nbytes, group, k)
                call()
                dist.barrier()
                reps = max(2, (8 << 20) // nbytes)
                c0 = time.process_time()
                for _ in range(reps):
                    call()
                lines.append(f"{kind} {k} {nbytes} {(time.process_time() - c0) / reps}")
        k *= 2
    dist.barrier()
    with open(f"{out_path}.{rank}", "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    dist.destroy_process_group()


def collective_cpu(cores: int) -> tuple[tuple[str, int, float, float], ...]:
    """(kind, group size k, CPU seconds a call, CPU seconds a byte) of gloo's all-reduce, all-gather
    and reduce-scatter between processes of this host: 4 x cores forked ranks (_fork_ranks; at least 4,
    a power of two; the ranks outnumbering the cores as a job's do here), split into groups of k
    = 2, 4, ... running at once; each line through the mean CPU a call of every process (its gloo
    threads' included) at the two COLLECTIVE_SIZES (a per-call and a per-byte part, neither below 0)."""
    world = 4
    while world < 4 * cores:
        world *= 2
    with tempfile.TemporaryDirectory() as tmp:
        out = _run_ranks("_collectives", world, tmp)
        cpu: dict[tuple[str, int, int], list[float]] = {}
        for rank in range(world):
            with open(f"{out}.{rank}", encoding="utf-8") as fh:
                for line in fh.read().split("\n"):
                    kind, k, nbytes, s = line.split()
                    cpu.setdefault((kind, int(k), int(nbytes)), []).append(float(s))
    rows, (s1, s2) = [], COLLECTIVE_SIZES
    for kind, k in dict.fromkeys(key[:2] for key in cpu):  # in the order measured: k, then kind
        c1, c2 = (sum(cpu[(kind, k, s)]) / world for s in (s1, s2))
        per_byte = max(0.0, (c2 - c1) / (s2 - s1))
        per_call = c1 - per_byte * s1
        if per_call < 0:
            per_call, per_byte = 0.0, c2 / s2
        rows.append((kind, k, per_call, per_byte))
    return tuple(rows)


def calibrate() -> Hardware:
    """The local Hardware, measured now (about 25 s on 2 cores; the gloo benchmarks' ranks forked
    from one fresh interpreter, as the cluster's ranks are: train/forkrun.py)."""
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
                    shared_flops=shared_flops, collective_cpu=collective_cpu(cores))


if __name__ == "__main__":
    print(calibrate())
