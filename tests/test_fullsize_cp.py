"""Context parallel under the full-size recorder: torch's ring attention's collectives are recorded with
their own kinds and bytes (train/plan/fullsize/ring.py) and priced by speed.py.

    python -m pytest -q -n 0 tests/test_fullsize_cp.py

One process: torch's fake process group (world 2, rank 0), a 1-D CP mesh, FakeTensorMode under the
Recorder; q, k, v sharded on the sequence (Shard(2)) and FlashAttention's op (what the full-size run
calls for SDPA) forward and backward with CP's dispatcher on, as torchtitan runs it.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._context_parallel import _attention as cp
from torch.testing._internal.distributed.fake_pg import FakeStore

from simcluster.train.plan.fullsize.device import constants
from simcluster.train.plan.fullsize.record import Recorder
from simcluster.train.plan.fullsize.ring import CP_GATHER, CP_PERMUTE
from simcluster.train.plan.fullsize.speed import collective_s

CP, BATCH, HEADS, SEQ, DIM = 2, 1, 4, 1024, 64  # the rank's shard: 1 x 4 x 512 x 64 bf16 = 256 KiB a tensor
SHARD = BATCH * HEADS * SEQ // CP * DIM


@pytest.fixture()
def mesh():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=CP)
    cp._enable_context_parallel_dispatcher()
    try:
        yield init_device_mesh("cpu", (CP,))
    finally:
        cp._disable_context_parallel_dispatcher()
        dist.destroy_process_group()


@pytest.fixture()
def rotate(request):
    """CP's K/V rotation for the test (torch's option, put back after it)."""
    before = cp._cp_options.rotate_method
    cp.set_rotate_method(request.param)
    try:
        yield request.param
    finally:
        cp._cp_options.rotate_method = before


@pytest.mark.parametrize("rotate", ["allgather", "alltoall"], indirect=True)
def test_the_rings_collectives_have_their_own_kinds_and_bytes(mesh, rotate):
    """allgather: one all-gather of K and V a ring (its output: both CP ranks' blocks, bf16), in the
    forward and again in the backward; alltoall: CP - 1 permutes of the rank's K and V instead. The
    backward then sends the gradients of K and V on round the ring, one permute a ring step (CP of them;
    float32, CP's accumulators; each the rank's shard). TP's name (all_gather_into_tensor) is not used,
    so Float8 (variants.py) leaves them alone."""
    with FakeTensorMode(allow_non_fake_inputs=True), Recorder() as rec:
        q, k, v = (DTensor.from_local(torch.empty(BATCH, HEADS, SEQ // CP, DIM, dtype=torch.bfloat16,
                                                  requires_grad=True), mesh, [Shard(2)], run_check=False)
                   for _ in range(3))
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]
        out.to_local().sum().backward()  # the gradient keeps Shard(2), as after torchtitan's attention module
    ring = [(e[1], e[2], e[3]) for e in rec.events if e[0] == "c"]
    gather, permute = (CP_GATHER, CP * 2 * SHARD * 2, CP), (CP_PERMUTE, 2 * SHARD * 2, CP)
    kv = [gather] if rotate == "allgather" else [permute] * (CP - 1)
    dkv = (CP_PERMUTE, 2 * SHARD * 4, CP)
    assert ring == [*kv, *kv, *[dkv] * CP]
    device = constants("h100-96g")
    assert collective_s(CP_PERMUTE, dkv[1], (0, 1), device) == pytest.approx(
        dkv[1] / device.intra_bw + device.latency_s)  # a send: all of it to one peer
    assert rec.ring == 0
