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

from simcluster.train.rundir import read_metrics

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


if __name__ == "__main__":
    ranks(sys.argv[1])
