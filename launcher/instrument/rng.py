"""The CPU bridge of DTensor's random ops: each shard its own draw, as torch's GPU tracker gives it.

    python -c "import simcluster.launcher.instrument.rng as r; print(r.GUARANTEES)"
    torchrun --nproc-per-node 2 tests/test_bridges.py OUT.json rng     # 2 ranks: shards, replicas, generators

The gap (torch 2.13, CPU): DTensor's random ops (``nn.init.normal_`` on a sharded weight, dropout on
a DTensor, ``torch.rand`` of a DTensor) run through an RNG tracker only where the mesh's device has a
Philox generator (``torch.distributed.tensor._random.is_rng_supported_mesh``). On a CPU mesh there is
none: every rank draws its local shard from the same CPU generator state, so the shards of a random
init are identical (the full weight's halves are equal), with the warning ``DTensor random operators
may not have complete support on cpu device mesh``. On GPUs, ``OffsetBasedRNGTracker`` moves each
shard's Philox offset by its linear shard index (``_set_pre_op_offset``) and every rank's offset
past the whole tensor afterwards (``_set_post_op_offset``).

The bridge gives a CPU mesh the same GUARANTEES with the CPU's own generator (Mersenne Twister has no
offset to move): from the generator state every rank shares (the user's ``torch.manual_seed``), one
draw gives a base seed and the state every rank ends in; the local op runs under
``base + shard index * a large odd constant`` in a forked generator, so the values depend on the
shard index (and thus on the mesh, as on GPUs) but never on the rank. It is installed as DTensor's
tracker (``torch.distributed.tensor._random._rng_tracker``), which DTensor's dispatch then uses for
every random op on a non-CUDA tensor; a tracker torch or the user set first is left alone. With the
tracker installed, torch's warnings that random ops and ``manual_seed`` "may not have complete
support on cpu device mesh" are silenced (the bridge handles them), and DTensor's
``manual_seed(seed, mesh)`` on a CPU mesh seeds the generator the tracker draws from (on GPUs, the
CUDA generator its tracker draws from), where torch would warn and do nothing.
"""
from __future__ import annotations

import contextlib
import warnings

GUARANTEES = ("no two shards of a sharded random op are alike", "replicas of a shard are equal",
              "every rank's generator ends in the same state", "a rerun on the same mesh repeats the values")
GOLDEN = 0x9E3779B97F4A7C15  # odd: shard seeds base + i * GOLDEN (mod 2**63) differ for every shard index


def tracker_class():
    """The tracker class (defined on first use: torch is imported here, not at this module's import)."""
    import torch
    from torch.distributed.tensor import _random

    class CpuRNGTracker(_random._RNGStateTracker):
        """DTensor's RNG tracker for a CPU mesh (see the module's docstring): ``_distribute_region``
        runs one random op on the local shard under the shard's own seed."""

        def __init__(self) -> None:
            super().__init__(torch.device("cpu"))

        @contextlib.contextmanager
        def _distribute_region(self, spec, generator: torch.Generator | None = None):
            if not self.distribute_region_enabled:
                yield
                return
            draw = torch.Generator()
            draw.set_state(generator.get_state() if generator is not None else torch.get_rng_state())
            base = int(torch.randint(0, 2**62, (1,), generator=draw))
            after = draw.get_state()  # the same on every rank that shared the state before
            shard_idx, shards = _random._calc_shard_info(spec.mesh.get_coordinate(), spec)
            index = int(_random._calc_shard_linear_idx(shard_idx, shards))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed((base + index * GOLDEN) % 2**63)
                yield  # DTensor runs the local op on the default CPU generator, seeded for this shard
            if generator is not None:
                generator.set_state(after)
            else:
                torch.set_rng_state(after)

    return CpuRNGTracker


def install() -> bool:
    """Make the CPU tracker DTensor's RNG tracker unless one is set or an accelerator is present;
    True when this process's tracker is the bridge. Idempotent. Raises ImportError without torch."""
    import torch
    from torch.distributed.tensor import _random

    if torch._C._get_accelerator().type != "cpu":  # a real GPU's own tracker applies (not the simulated one's)
        return False
    if _random._rng_tracker is None:
        _random._rng_tracker = tracker_class()()
    ours = type(_random._rng_tracker).__name__ == "CpuRNGTracker"
    if ours:
        warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support on cpu "
                                                  "device mesh")
        warnings.filterwarnings("ignore", message="DTensor manual_seed.. may not have complete support")
        if not hasattr(_random.manual_seed, "__simulated__"):
            torch_seed = _random.manual_seed

            def manual_seed(seed: int, device_mesh) -> None:
                if device_mesh.device_type == "cpu":
                    torch.default_generator.manual_seed(int(seed))
                    return
                torch_seed(seed, device_mesh)
            manual_seed.__simulated__ = torch_seed
            _random.manual_seed = manual_seed
    return ours
