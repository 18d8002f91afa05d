"""The full-size recorder sees inside a DTensor's op: the local ops its dispatch runs (their temporaries,
their implicit collectives), and not the global-shape fakes of DTensor's sharding propagation.

    python -m pytest -q -n 0 tests/test_fullsize_record.py

One process: torch's fake process group (world 8, rank 0), a 1-D mesh, FakeTensorMode under the
Recorder, the loss parallel's log-softmax of a vocabulary-sharded float32 tensor (torchtitan's loss).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from simcluster.train.plan.fullsize.memory import replay
from simcluster.train.plan.fullsize.device import constants
from simcluster.train.plan.fullsize.record import Recorder
from simcluster.train.plan.fullsize.trace import Trace

WORLD, ROWS, VOCAB = 8, 64, 8 * 1024  # local shard: 64 x 1024 float32 = 256 KiB


@pytest.fixture()
def mesh():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield init_device_mesh("cpu", (WORLD,))
    finally:
        dist.destroy_process_group()


def test_a_dtensor_ops_temporaries_and_collectives_are_recorded(mesh):
    """log_softmax under loss_parallel: x - max and exp(x - max) live beside x inside the handler (three
    local shards at once), its two all-reduces recorded; no allocation of the global shape."""
    local = ROWS * VOCAB // WORLD * 4
    with FakeTensorMode(allow_non_fake_inputs=True), Recorder() as rec:
        x = DTensor.from_local(torch.empty(ROWS, VOCAB // WORLD), mesh, [Shard(1)], run_check=False)
        with loss_parallel():
            y = torch.log_softmax(x, dim=-1)
        del y
    sizes = [e[2] for e in rec.events if e[0] == "a"]
    assert max(sizes) == local  # nothing of the global shape (64 x 8192 x 4 = 2 MiB)
    assert [e[1] for e in rec.events if e[0] == "c"] == ["all_reduce", "all_reduce"]
    assert {"amax", "sub", "exp", "sum", "log"} <= {e[5] for e in rec.events if e[0] == "op"}
    trace = Trace(0, WORLD, 0.0, 0, tuple(rec.phases), tuple(rec.events), {}, None)
    peak = replay(trace, constants("h100-96g")).peak_allocated - 32 * (1 << 20)  # less cuBLAS's workspace
    assert peak >= 3 * local  # x, x - max, exp(x - max): the handler's temporaries, not just its output
