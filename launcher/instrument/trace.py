"""``--trace-steps`` for the user's code: torch.profiler around the chosen steps of every rank.

    python -m launcher up --mesh 2x2x2 --trace-steps 2 --script examples/manual_3d.py -- --steps 3
    # open runs/manual_3d-mesh-2x2x2/trace.json in https://ui.perfetto.dev

Step boundaries are the clock's (instrument/clock.py), and a boundary runs inside
``Optimizer.step``'s own profiler range, which a profiler started there would see end under it
(torch 2.13 then crashes the rank). So a traced step's profiler starts at the first module
forward after the boundary that begins it (a global forward pre-hook, registered only while a
traced step is pending; step 1: at once, when torch is imported, so it holds the setup too) and
stops at the boundary that ends it. Each writes RUN_DIR/trace/rank-R-step-S.json through the
trainer's own ``train.profiling.StepProfile`` with the events of USER_KEEP (gloo's send/recv and
collectives, FSDP, DTensor's functional collectives, the optimizer, torch pipelining's actions,
the layers' linear and attention ops and autograd's backward functions). ``launcher up`` (and
``launcher report`` for a run started with plain ``docker compose up``) merges them into
RUN_DIR/trace.json, one process per node and one track per rank (simcluster/core/timeline.py).
"""
from __future__ import annotations


class TraceListener:
    """Profiles the steps in ``steps`` on this rank (rank on node ``node``)."""

    def __init__(self, out_dir: str, rank: int, node: int, steps: tuple[int, ...]):
        self.out_dir, self.rank, self.node, self.steps = out_dir, rank, node, set(steps)
        self.active = None
        self.pending: int | None = None
        self.hook = None
        if 1 in self.steps:
            self._start(1)

    def _start(self, step: int) -> None:
        from simcluster.train.profiling import USER_KEEP, StepProfile

        self.active = StepProfile(self.out_dir, self.rank, self.node, step, USER_KEEP)
        self.active.start()

    def _on_forward(self, _module, _args) -> None:
        if self.pending is not None and self.active is None:
            step, self.pending = self.pending, None
            self.hook.remove()
            self.hook = None
            self._start(step)

    def begin(self, step: int) -> None:
        if step in self.steps:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self.pending = step
            if self.hook is None:
                self.hook = register_module_forward_pre_hook(self._on_forward)

    def end(self, step: int) -> None:
        if self.active is not None and self.active.step == step:
            self.active.stop()
            self.active = None
