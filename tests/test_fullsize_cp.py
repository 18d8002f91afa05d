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


def test_a_program_using_torchs_context_parallel_runs_its_ring_as_on_gpus(tmp_path):
    """examples/fullsize/cp.py (no simcluster import) under the full-size plan, 2 ranks: torch's
    context_parallel() shards the host-made batch in place (resize_ and copy_ of real tensors: the
    embedding looks up 2,048 of the 4,096 tokens), replaces F.scaled_dot_product_attention by its ring
    in the forward as in the backward (one K/V all-gather each, FlashAttention's op twice each), and the
    program's own torch.cuda.memory_stats()["active_bytes.all.peak"] is the trace's peak of live bytes."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    from simcluster.train.plan.fullsize.speed import step_of
    from simcluster.train.plan.fullsize.trace import read

    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", "--script", "examples/fullsize/cp.py", "--nodes",
           "1", "--nproc-per-node", "2", "--gpu", "h100-96g", "--ranks", "0", "--trace-dir", str(tmp_path), "--json",
           "--", "--steps", "2"]
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["ranks"][0]["fits"] is True
    t = read(str(tmp_path / "trace-0.json"))
    where = {"op": 3, "c": 5, "tok": 2}  # the index of each event kind's phase
    step2 = [e for e in t.events if e[0] in where and step_of(t.phases[e[where[e[0]]]]) == 2]
    names = [e[5] if e[0] == "op" else e[1] for e in step2 if e[0] in ("op", "c")]
    assert [e[1] for e in step2 if e[0] == "tok"] == [2048]
    assert names.count("_scaled_dot_product_flash_attention") == 2  # the ring's two steps, forward
    assert names.count("_scaled_dot_product_flash_attention_backward") == 2
    assert names.count(CP_GATHER) == 2 and names.count(CP_PERMUTE) == 2  # K/V gathered forward and backward
    printed = [float(x) for x in re.findall(r"peak active ([0-9.]+) MiB", (tmp_path / "log-0.txt").read_text())]
    size: dict[int, int] = {}
    live, peaks = 0, {1: 0, 2: 0}
    for e in t.events:  # the peak of live bytes up to the end of each step, as the program printed it
        if e[0] in ("a", "r", "f"):
            live += (e[2] if e[0] != "f" else 0) - size.pop(e[1], 0)
            if e[0] != "f":
                size[e[1]] = e[2]
            at = step_of(t.phases[e[2] if e[0] == "f" else e[3]])
            for s in peaks:
                peaks[s] = max(peaks[s], live) if at <= s else peaks[s]
    assert printed == [round(peaks[1] / 2**20, 1), round(peaks[2] / 2**20, 1)] and printed[0] > 0


def test_a_value_check_is_answered_true_and_named(tmp_path):
    """A program's torch.allclose on fake tensors (PyTorch's context parallel tutorial asserts one
    against the full attention) is answered True and its line listed, not a failure."""
    import subprocess
    import sys
    from pathlib import Path

    prog = tmp_path / "check.py"
    prog.write_text("import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
                    "x = torch.randn(4, 4, device='cuda')\nassert torch.allclose(x, x.clone())\n"
                    "assert torch.equal(x, x)\nprint('checked')\n")
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-m", "launcher", "plan", "--full-size", "--script", str(prog), "--nodes", "1",
                        "--nproc-per-node", "2", "--ranks", "0", "--trace-dir", str(tmp_path / "tr")], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"{prog}:5 (assert torch.allclose(x, x.clone())) x1" in p.stdout
    assert f"{prog}:6 (assert torch.equal(x, x)) x1" in p.stdout
    assert "checked" in (tmp_path / "tr" / "log-0.txt").read_text()
