"""The CPU bridges (launcher/instrument/bridges.py) on host processes, no Docker: SDPA on DTensors
over 2 gloo ranks equals SDPA on full tensors, forward and backward, and only with the bridge;
examples/llama_2d.py on dp 2 x tp 2 gives one process's loss at every step.

    python -m pytest -q tests/test_bridges.py
    torchrun --nproc-per-node 2 tests/test_bridges.py OUT.json     # the ranks of the first test, by hand
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.core.rundir import read_metrics

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
TOL = 1e-6  # float32 attention, bridged against full tensors
SHAPE = (2, 4, 8, 16)  # (batch, heads, seq, head_dim)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def ranks(result: str) -> None:
    """Each rank of a gloo world (torchrun): SDPA on DTensors without the bridge, then with it, against
    SDPA on the full tensors; rank 0 writes what it measured to the file result (JSON)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from simcluster.launcher.instrument import bridges

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)

    def attend(placement, causal=False, mask=None, mask_placement=Replicate()):
        """Max |bridged - full| of the output and of the grads of q, k, v; the placements; the output."""
        q, k, v = (torch.randn(*SHAPE, requires_grad=True) for _ in range(3))
        grad = torch.randn(*SHAPE)
        full = F.scaled_dot_product_attention(q, k, v, is_causal=causal, attn_mask=mask)
        full.backward(grad)
        dq, dk, dv = (distribute_tensor(t.detach(), mesh, [placement]).requires_grad_() for t in (q, k, v))
        dmask = None if mask is None else distribute_tensor(mask, mesh, [mask_placement])
        out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=causal, attn_mask=dmask)
        out.backward(distribute_tensor(grad, mesh, out.placements))
        diffs = [(out.full_tensor() - full).abs().max().item()]
        diffs += [(d.grad.full_tensor() - t.grad).abs().max().item() for d, t in ((dq, q), (dk, k), (dv, v))]
        return {"in": repr(placement), "causal": causal, "out": repr(out.placements[0]),
                "grad": repr(dq.grad.placements[0]), "diffs": diffs, "local": list(out.to_local().shape)}, full

    res = {"unbridged": []}
    # Unbridged, the causal forward fails at once; the plain one is traced through torch's decomposition
    # (about 30 s here, output Replicate), so its backward op is called directly: it has no decomposition.
    q, k, v = (torch.randn(*SHAPE) for _ in range(3))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    d = {n: distribute_tensor(t, mesh, [Shard(1)]) for n, t in dict(q=q, k=k, v=v, out=out, lse=lse).items()}
    for call in (lambda: F.scaled_dot_product_attention(d["q"], d["k"], d["v"], is_causal=True),
                 lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                     d["out"], d["q"], d["k"], d["v"], d["out"], d["lse"], 0.0, False)):
        try:
            call()
            res["unbridged"].append("no error")
        except NotImplementedError as e:
            res["unbridged"].append(str(e))
    res["installed"] = [bridges.install(), bridges.install()]
    res["attention"], fulls = [], {}
    for placement in (Shard(1), Replicate(), Shard(0)):
        for causal in (False, True):
            torch.manual_seed(1)  # the same q, k, v for causal and not
            row, fulls[causal] = attend(placement, causal)
            res["attention"].append(row)
    res["causal_changes_output"] = (fulls[True] - fulls[False]).abs().max().item()
    res["mask"] = [attend(Shard(1), mask=torch.randn(8, 8))[0],  # broadcasts over batch and heads
                   attend(Shard(1), mask=torch.randn(2, 4, 8, 8))[0]]  # a heads extent: runs replicated
    try:
        attend(Shard(1), mask=torch.randn(2, 4, 8, 8), mask_placement=Shard(1))
        res["sharded_mask"] = "no error"
    except NotImplementedError as e:
        res["sharded_mask"] = str(e)
    if dist.get_rank() == 0:
        Path(result).write_text(json.dumps(res))
    dist.destroy_process_group()
    mesh = d = None  # drop what holds process groups while the interpreter is whole (examples/ddp.py)
    gc.collect()


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """What ranks() measured on 2 ranks."""
    out = tmp_path_factory.mktemp("bridges") / "res.json"
    proc = subprocess.run([*TORCHRUN, "--nproc-per-node=2", __file__, str(out)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_without_the_bridge_sdpa_on_dtensors_fails_on_cpu(measured):
    forward, backward = measured["unbridged"]
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy" in forward
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default does not have a sharding" in backward


def test_install_is_idempotent_and_names_what_it_bridged(measured):
    from simcluster.launcher.instrument import bridges
    first, again = measured["installed"]
    assert first == again == list(bridges.BRIDGED) == [bridges.FORWARD, bridges.BACKWARD]


def test_bridged_attention_equals_full_attention_forward_and_backward(measured):
    rows = measured["attention"]
    assert [(r["in"], r["causal"]) for r in rows] == [(p, c) for p in ("Shard(dim=1)", "Replicate()", "Shard(dim=0)")
                                                       for c in (False, True)]
    for r in rows:
        assert r["out"] == r["grad"] == r["in"], r  # heads stay sharded: no gather
        assert max(r["diffs"]) <= TOL, r
    halved = {"Shard(dim=1)": [2, 2, 8, 16], "Shard(dim=0)": [1, 4, 8, 16], "Replicate()": list(SHAPE)}
    assert all(r["local"] == halved[r["in"]] for r in rows)
    assert measured["causal_changes_output"] > 0.1  # is_causal reached the kernel


def test_masks(measured):
    broadcast, extent = measured["mask"]
    assert broadcast["out"] == "Shard(dim=1)" and max(broadcast["diffs"]) <= TOL, broadcast
    assert extent["out"] == "Replicate()" and max(extent["diffs"]) <= TOL, extent
    assert "takes a Replicate attn_mask, got (Shard(dim=1),)" in measured["sharded_mask"]


def test_context_parallel_runs_torchs_ring_on_the_cpu_op(tmp_path):
    """examples/context_parallel.py on 2 ranks through the bridges: torch's context_parallel() (sequence
    sharded, causal load-balanced) equals one process's SDPA, output and gradients, causal and not, both
    K/V rotations; torch 2.13 alone fails there (its ring handles the CUDA ops only)."""
    out = tmp_path / "cp.json"
    cmd = [*TORCHRUN, "--nproc-per-node=2", "-m", "simcluster.launcher.instrument.bridges",
           "examples/context_parallel.py", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert [(r["causal"], r["rotate"]) for r in res["results"]] == [
        (c, r) for c in (False, True) for r in ("allgather", "alltoall")]
    assert all(r["local_seq"] == 32 for r in res["results"])  # seq 64 split in two: the ring ran
    assert res["worst"] <= 1e-5, res


def _data(tmp_path: Path) -> Path:
    """The shared corpus beside the repository, else a small stand-in text."""
    shared = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    if shared.is_file():
        return shared
    path = tmp_path / "text.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200)
    return path


def test_llama_2d_needs_the_bridge_on_cpu(tmp_path):
    plain = [*TORCHRUN, "--nproc-per-node=2", "examples/llama_2d.py", "--tp=2", "--steps=1", "--layers=1",
             f"--data={_data(tmp_path)}", f"--out-dir={tmp_path}"]
    proc = subprocess.run(plain, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "_scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy" in proc.stderr
    # the same command with the bridges (what plain torchrun on the host takes; the cluster's ranks
    # have them already: tests/test_user_code.py runs llama_2d on 2 x 2 against one process)
    bridged = [*TORCHRUN, "--nproc-per-node=2", "-m", "simcluster.launcher.instrument.bridges",
               *plain[len(TORCHRUN) + 1:]]
    proc = subprocess.run(bridged, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert 5.0 < read_metrics(str(tmp_path))[0]["loss"] < 6.0  # ln 256 = 5.55 at the first step


def rng_ranks(result: str) -> None:
    """Each rank of a 4-rank gloo world on a (dp 2, tp 2) CPU mesh: a sharded random init without the
    RNG bridge (torch 2.13's behaviour: the shards drawn alike), then with it, twice from one seed, and
    a ColwiseParallel Linear initialized after parallelizing; rank 0 writes what every rank drew."""
    import warnings

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from simcluster.launcher.instrument import rng

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    def gathered(x: torch.Tensor) -> list[list[float]]:
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return [o.flatten().tolist() for o in out]

    def init(seed: int) -> list[list[float]]:
        torch.manual_seed(seed)
        w = distribute_tensor(torch.empty(8, 4), mesh, [Replicate(), Shard(0)])
        nn.init.normal_(w)
        return gathered(w.to_local())

    res = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res["unbridged"] = init(0)
        res["unbridged_warned"] = any("may not have complete support" in str(w.message) for w in caught)
        res["installed"] = [rng.install(), rng.install()]
        caught.clear()
        res["bridged"], res["again"], res["other_seed"] = init(0), init(0), init(1)
        res["state_after"] = gathered(torch.get_rng_state().float())
        torch.manual_seed(0)
        lin = parallelize_module(nn.Linear(4, 8, bias=False), mesh["tp"], ColwiseParallel())
        nn.init.normal_(lin.weight)
        res["colwise"] = gathered(lin.weight.to_local())
        res["bridged_warned"] = [str(w.message) for w in caught if "random" in str(w.message)]
    if dist.get_rank() == 0:
        Path(result).write_text(json.dumps(res))
    dist.destroy_process_group()
    mesh = lin = None
    gc.collect()


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> dict:
    """What rng_ranks() drew on 4 ranks (dp 2 x tp 2); rank r holds tp shard r % 2."""
    out = tmp_path_factory.mktemp("rng") / "res.json"
    proc = subprocess.run([*TORCHRUN, "--nproc-per-node=4", __file__, str(out), "rng"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_without_the_rng_bridge_the_shards_of_a_random_init_are_alike_on_cpu(drawn):
    """torch 2.13's CPU path, pinned: every rank draws its shard from the same generator state."""
    shards = drawn["unbridged"]
    assert shards[0] == shards[1] == shards[2] == shards[3] and drawn["unbridged_warned"]


def test_the_rng_bridge_gives_the_gpu_trackers_guarantees(drawn):
    """No two shards alike, replicas (dp) equal, every rank's generator in one state after, a rerun
    repeats the values, another seed changes them; the ColwiseParallel weight's halves differ; no warning."""
    tp0, tp1, tp0_replica, tp1_replica = drawn["bridged"]
    assert drawn["installed"] == [True, True]
    assert tp0 != tp1 and tp0 == tp0_replica and tp1 == tp1_replica
    assert len(set(tp0) | set(tp1)) == len(tp0) + len(tp1)  # no value shared between the shards
    assert all(state == drawn["state_after"][0] for state in drawn["state_after"])
    assert drawn["again"] == drawn["bridged"] and drawn["other_seed"] != drawn["bridged"]
    colwise = drawn["colwise"]
    assert colwise[0] != colwise[1] and colwise[0] == colwise[2] and colwise[1] == colwise[3]
    assert drawn["bridged_warned"] == []
    mean = sum(tp0 + tp1) / len(tp0 + tp1)
    assert abs(mean) < 0.6  # drawn from normal(0, 1): 16 values


if __name__ == "__main__":
    rng_ranks(sys.argv[1]) if sys.argv[2:] == ["rng"] else ranks(sys.argv[1])
    from simcluster.train.__main__ import exit_now
    exit_now(0)  # no interpreter teardown: a gloo thread outliving it aborted a rank on a busy machine


def test_compiled_checkpointing_of_a_dtensor_block_needs_the_rng_bridge_on_cpu():
    """torch 2.13 on the CPU, no simulation: a compiled, checkpointed block with SDPA (a random op) and
    tensor-parallel Linears (a DeviceMesh saved for backward) fails in AOT autograd's runtime, with
    torchtitan's error; with launcher/instrument/compile_rng.py it runs and equals eager, loss and grad."""
    out = subprocess.run([sys.executable, "-m", "simcluster.launcher.instrument.compile_rng", "eager", "compiled",
                          "bridged"], env=_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["compiled"]["error"].startswith("AssertionError: expected all tensors_saved_with_vc_check to be "
                                               "Tensors"), got
    assert "DeviceMesh" in got["compiled"]["error"], got
    assert "error" not in got["eager"], got
    assert got["bridged"] == got["eager"], got
    assert got["eager"]["grad"] > 0, got
    assert "Traceback" not in out.stderr and "Warning" not in out.stderr, out.stderr[-3000:]
