"""What the simulated GPU's memory counting costs per op: in one process, and on the cluster.

    python -m bench.gpu_memory --repeats 5 --steps 30
    python -m bench.gpu_memory --cluster 3 --steps 300     # also 1 node x 2 ranks, simulated GPU on and off
    python -m bench.gpu_memory --alloc 5                   # only the cost of one allocation and free

In one process (each measurement in a fresh interpreter, one thread, CPU time: less sensitive than
wall time to the other processes of a shared machine): two models' training steps, the small-op
step of issue 53 (an 8-layer, 64-wide MLP on a batch of 32, AdamW: bench/mlp_step.py's) and a
decoder-like stack (4 x Linear + GELU + LayerNorm on (32, 64, 256) activations), each counted three
ways: ``off`` (nothing), ``allocator`` (the compiled counting allocator, gpu/counting_allocator.cpp:
what a rank runs) and ``per-op`` (the dispatch mode of gpu/tracker.py, the fallback), and ``device-check`` (the least a
per-op check of mixed cuda and cpu tensors costs: a dispatch mode reading a mark on each tensor
argument; measured only, to decide whether such a check can be on by default), and ``check-devices``
(the allocator with --check-devices' whole check installed: gpu/devcheck.py, marks read from the
allocator, outputs marked, the doors wrapped). Prints the
median step time of each over --repeats interpreters, the ratios to ``off`` and the aten ops a step
runs, with the load average.

``--cluster R``: R rounds, alternated, of ``launcher up --nodes 1 --nproc-per-node 2 --script
bench/mlp_step.py --mount-code`` with the simulated GPU and with ``--no-simulated-gpus``; the
steady step is the median of both ranks' ``step_time_s`` (the cluster's step clock) after the first
10 steps. Needs Docker and a trainer image built from this checkout (the allocator is compiled into
it); SIMCLUSTER_IMAGE names another. The cost bound of issue 53: on / off at most 1.1.

``--alloc R``: R rounds, alternated, of a fresh interpreter per mode (``off``, ``allocator``) timing
``torch.empty(64)``, made and freed at once, beside 300 live tensors: the least CPU time of a call
over 9 blocks of 200,000 (ns), what the allocator adds to each allocation and free.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.args import positive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("off", "allocator", "per-op", "device-check", "check-devices")
MODELS = ("mlp", "decoder")


def _model(torch, name: str):
    if name == "mlp":
        layers = [m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
        return torch.nn.Sequential(*layers), torch.randn(32, 64)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.LayerNorm(256))]
    return torch.nn.Sequential(*layers), torch.randn(32, 64, 256)


def device_check(torch):
    """The least a mixed-device check costs per op (measured, not installed in ranks): a dispatch mode
    that reads a "made for cuda" mark on each tensor argument, would raise CUDA's "Expected all
    tensors to be on the same device" where marked and unmarked (non-scalar) tensors meet. A real
    check would also mark each op's outputs: this is a lower bound of its cost."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class DeviceCheck(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            marked = plain = False
            for a in tree_flatten((args, kwargs))[0]:
                if isinstance(a, torch.Tensor):
                    if getattr(a, "_sim_cuda", True):
                        marked = True
                    elif a.dim():
                        plain = True
            if marked and plain:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                   "cuda:0 and cpu!")
            return func(*args, **(kwargs or {}))

    return DeviceCheck()


def one(mode: str, name: str, steps: int) -> dict:
    """One interpreter's measurement: {"step_s": median CPU time of a step, "ops": aten ops a step,
    "allocated": the counter's bytes at the end (None off)}."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(1)
    counter = None
    if mode in ("allocator", "check-devices"):
        from simcluster.launcher.instrument.gpu.native import load
        counter = load(80 * 2**30)
        if counter is None:
            raise RuntimeError("the compiled allocator could not be built or loaded (g++ and torch's headers)")
        if mode == "check-devices":
            from simcluster.launcher.instrument.gpu.devcheck import install
            install(torch, counter)
    elif mode == "per-op":
        from simcluster.launcher.instrument.gpu.tracker import make_tracker
        counter = make_tracker()
        counter.__enter__()
    elif mode == "device-check":
        device_check(torch).__enter__()
    torch.manual_seed(0)
    model, x = _model(torch, name)
    opt = torch.optim.AdamW(model.parameters())

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    times = []
    for _ in range(steps):
        t0 = time.process_time()
        step()
        times.append(time.process_time() - t0)

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return {"step_s": statistics.median(times), "ops": Count.n,
            "allocated": counter.allocated if counter is not None else None}


def alloc_cost(mode: str, calls: int = 200_000) -> float:
    """One interpreter's ns per ``torch.empty(64)`` made and freed (``mode`` "off" or "allocator"):
    the least of 9 blocks of ``calls``, CPU time, one thread, 300 tensors of 64 to 363 floats live."""
    import torch

    torch.set_num_threads(1)
    if mode == "allocator":
        from simcluster.launcher.instrument.gpu.native import load
        if load(80 * 2**30) is None:
            raise RuntimeError("the compiled allocator could not be built or loaded (g++ and torch's headers)")
    live = [torch.empty(64 + i) for i in range(300)]
    empty, best = torch.empty, float("inf")
    for _ in range(9):
        t0 = time.process_time()
        for _ in range(calls):
            empty(64)
        best = min(best, (time.process_time() - t0) / calls)
    del live
    return best * 1e9


def alloc_rounds(rounds: int) -> None:
    got = {"off": [], "allocator": []}
    print("| round | mode | load before | ns per alloc+free |\n|---|---|---|---|")
    for r in range(rounds):
        for mode in (("off", "allocator") if r % 2 == 0 else ("allocator", "off")):
            load = os.getloadavg()[0]
            out = subprocess.run([sys.executable, "-m", "bench.gpu_memory", "--one-alloc", mode], cwd=ROOT,
                                 capture_output=True, text=True, check=True)
            got[mode].append(float(out.stdout.splitlines()[-1]))
            print(f"| {r + 1} | {mode} | {load:.1f} | {got[mode][-1]:.1f} |", flush=True)
    on, off = statistics.median(got["allocator"]), statistics.median(got["off"])
    print(f"torch.empty(64) made and freed: allocator {on:.1f} ns, off {off:.1f} ns, the allocator's cost "
          f"{on - off:.1f} ns (medians of {rounds})")


def in_process(repeats: int, steps: int) -> None:
    for name in MODELS:
        got = {m: [] for m in MODES}
        for _ in range(repeats):
            for mode in MODES:
                out = subprocess.run([sys.executable, "-m", "bench.gpu_memory", "--one", mode, "--model", name,
                                      "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True, check=True)
                got[mode].append(json.loads(out.stdout.splitlines()[-1]))
        med = {m: statistics.median(r["step_s"] for r in got[m]) for m in MODES}
        ops = got["off"][0]["ops"]
        print(f"{name}: {ops} aten ops a step; step CPU ms " + ", ".join(f"{m} {med[m] * 1e3:.3f}" for m in MODES)
              + "; " + ", ".join(f"{m}/off {med[m] / med['off']:.3f}" for m in MODES[1:])
              + f" (per-op: {(med['per-op'] - med['off']) / ops * 1e6:.1f} us per op); load {os.getloadavg()[0]:.1f}",
              flush=True)


def cluster_run(simulated: bool, steps: int, skip: int = 10) -> float:
    """One 1 x 2 run of bench/mlp_step.py: the steady step (s), median over both ranks."""
    out = os.path.join(tempfile.mkdtemp(prefix="bench-gpu-memory-"), "run")
    cmd = [sys.executable, "-m", "launcher", "up", "--nodes", "1", "--nproc-per-node", "2", "--script",
           os.path.join(ROOT, "bench", "mlp_step.py"), "--mount-code", "--quiet", "--run-dir", out,
           *(() if simulated else ("--no-simulated-gpus",)), "--", "--steps", str(steps)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    times = []
    for rank in (0, 1):
        path = os.path.join(out, "steps", f"rank-{rank}.jsonl")
        rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
        times += [r["step_time_s"] for r in rows[skip:]]
    if done.returncode != 0 or not times:
        raise RuntimeError(f"run exited {done.returncode} ({out}): {done.stdout[-1500:]}{done.stderr[-1500:]}")
    log = os.path.join(out, "cluster.log")
    if simulated and os.path.exists(log) and "counted per op" in open(log).read():
        raise RuntimeError(f"the ranks counted per op, not with the image's allocator (rebuild the image: "
                           f"bash images/build.sh): {log}")
    return statistics.median(times)


def on_cluster(rounds: int, steps: int) -> None:
    got = {True: [], False: []}
    print("| round | simulated GPU | load before | steady step ms |\n|---|---|---|---|")
    for r in range(rounds):
        for simulated in ((True, False) if r % 2 == 0 else (False, True)):
            load = os.getloadavg()[0]
            got[simulated].append(cluster_run(simulated, steps))
            print(f"| {r + 1} | {'on' if simulated else 'off'} | {load:.1f} | {got[simulated][-1] * 1e3:.3f} |",
                  flush=True)
    on, off = statistics.median(got[True]), statistics.median(got[False])
    print(f"cluster 1x2 small-op step: on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms, on/off {on / off:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=positive(int), default=5, help="interpreters per mode (default 5)")
    p.add_argument("--steps", type=positive(int), default=30, help="steps measured (default 30; --cluster: "
                   "steps a run, at least 20)")
    p.add_argument("--cluster", type=positive(int, zero=True), default=0, metavar="R", help="also R rounds on a "
                   "1 x 2 cluster (default 0: none)")
    p.add_argument("--alloc", type=positive(int, zero=True), default=0, metavar="R", help="only R rounds of the cost of "
                   "one allocation and free, off and with the allocator (default 0: the steps instead)")
    p.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--one-alloc", choices=("off", "allocator"), help=argparse.SUPPRESS)
    p.add_argument("--model", choices=MODELS, default="mlp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.model, args.steps)))
        return 0
    if args.one_alloc:
        print(alloc_cost(args.one_alloc))
        return 0
    if args.alloc:
        alloc_rounds(args.alloc)
        return 0
    if args.cluster and args.steps < 20:
        p.error(f"--steps {args.steps} with --cluster: a run needs at least 20 steps (10 are warm-up); e.g. --steps 300")
    if not args.cluster:
        in_process(args.repeats, args.steps)
    else:
        in_process(args.repeats, 30)
        on_cluster(args.cluster, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
