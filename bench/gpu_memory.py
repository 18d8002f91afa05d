"""What the simulated GPU's memory tracker costs: one process's training step with it and without.

    python -m bench.gpu_memory --repeats 5 --steps 20

The tracker (launcher/instrument/gpu/memory.py) is a TorchDispatchMode that sees every aten op's
outputs. This runs one small decoder-like model (a stack of Linear + GELU + LayerNorm on (32, 64,
256) activations, AdamW) for --steps steps, in turn with and without the tracker, --repeats
times; prints the median step time of each (the process's CPU time: less sensitive than wall time
to the other processes of a shared machine; one thread), their ratio, the aten ops a step runs and the cost
per op, with the load average beside them (the machines are shared). The rest of the simulated
GPU (device answers, cuda -> cpu at the tensor doors) costs nothing per op: it wraps the doors,
not the ops.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def step_times(tracked: bool, steps: int) -> tuple[float, int]:
    """Median step CPU time (s) over ``steps`` steps after one warm-up; the aten ops of one step."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from simcluster.launcher.instrument.gpu.memory import make_tracker

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.GELU(),
                                                                 torch.nn.LayerNorm(256))])
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64, 256)
    tracker = make_tracker() if tracked else None

    def one():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    if tracker is not None:
        tracker.__enter__()
    try:
        one()
        times = []
        for _ in range(steps):
            t0 = time.process_time()
            one()
            times.append(time.process_time() - t0)
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
    with Count():
        one()
    return statistics.median(times), Count.n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    off, on = [], []
    for _ in range(args.repeats):
        off.append(step_times(False, args.steps)[0])
        t, ops = step_times(True, args.steps)
        on.append(t)
    a, b = statistics.median(off), statistics.median(on)
    print(f"step time: tracker off {a * 1e3:.2f} ms, on {b * 1e3:.2f} ms, ratio {b / a:.3f}; "
          f"{ops} aten ops a step, {(b - a) / ops * 1e6:.1f} us per op; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
