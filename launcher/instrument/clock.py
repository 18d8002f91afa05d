"""Step boundaries of one rank of the user's code: optimizer steps, or the code's own marks.

    python -c "from simcluster.launcher.instrument.clock import Clock; c = Clock(); c.mark(); print(c.step)"

One step ends when the *clock optimizer* finishes ``step()``: the first optimizer of the process
that steps (torch.optim.optimizer.register_optimizer_step_post_hook calls the hook as
``hook(optimizer, args, kwargs)`` after every optimizer's step). A script with several
optimizers (one per model part, or a GAN's two) thus counts one step per step of the first one;
the others' steps fall inside it. If the clock optimizer is freed, the next one to step takes over.
Code that steps otherwise (no torch optimizer, gradient accumulation it wants counted as one
step) calls ``simcluster.step()`` after each step: from its first call on, only those marks count.

Each boundary ends step k (1-based) and starts step k + 1: listeners' ``end(k)`` run, the step's
record is written (RUN_DIR/steps/rank-R.jsonl: ``{"step", "step_time_s", "rss_mb", "time", "restart"}``:
seconds, MB of peak RSS so far, UNIX time of the boundary, $SIMCLUSTER_RESTART_COUNT; with a simulated
GPU ``device_peak_mb``, the most its tensors held so far, gpu/memory.py; a restarted
job appends, counting its steps from 1 again), then ``begin(k + 1)``. A step's time
runs from the previous boundary (for step 1: from when the instruments started, before the user's
code imported torch, so it includes the setup) and leaves out the listeners' own work.
"""
from __future__ import annotations

import json
import os
import resource
import time
import weakref

from simcluster.launcher.instrument.spec import STEPS_DIR
from simcluster.train.stallwatch import STEPS


class Clock:
    """The step counter of one rank; ``listeners`` have ``begin(step)`` and ``end(step)``.

    out_dir: the run folder ($SIMCLUSTER_OUTPUT_DIR); None writes no records (outside the cluster).
    """

    def __init__(self, out_dir: str | None = None, rank: int = 0, listeners: list | None = None):
        self.step, self.explicit, self.listeners = 0, False, list(listeners or [])
        self.fields: list = []  # callables returning more keys of each step record (the simulated GPU's peak)
        self._opt = None
        self._t = time.perf_counter()
        self.path = None
        self.restart = int(os.environ.get("SIMCLUSTER_RESTART_COUNT", "0") or 0)
        if out_dir:
            folder = os.path.join(out_dir, STEPS_DIR)
            os.makedirs(folder, exist_ok=True)
            self.path = os.path.join(folder, f"rank-{rank}.jsonl")
            if not self.restart and os.path.exists(self.path):
                os.remove(self.path)  # a previous run's, in a reused folder (a restart appends)

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        """The global post-step hook: a boundary when ``optimizer`` is the clock optimizer."""
        if self.explicit:
            return
        clock = self._opt() if self._opt is not None else None
        if clock is None:
            self._opt, clock = weakref.ref(optimizer), optimizer
        if clock is optimizer:
            self.boundary()

    def mark(self) -> None:
        """An explicit boundary (``simcluster.step()``); optimizer steps no longer count."""
        self.explicit = True
        self.boundary()

    def boundary(self) -> None:
        """End the current step: listeners' end, the step record, listeners' begin of the next."""
        now = time.perf_counter()
        self.step += 1
        rec = {"step": self.step, "step_time_s": round(now - self._t, 6),
               "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "time": round(time.time(), 3), "restart": self.restart}
        for more in self.fields:
            rec.update(more())
        STEPS[0] += 1  # the stall watch's progress (train/stallwatch.py)
        for listener in self.listeners:
            listener.end(self.step)
        if self.path:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
        for listener in self.listeners:
            listener.begin(self.step + 1)
        self._t = time.perf_counter()
