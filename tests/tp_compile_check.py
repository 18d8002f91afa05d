"""Tensor parallel under torch.compile (torch's bug, launcher/observe/failures.py TORCH_BUGS): one process
on torch's fake process group of world 2 (rank 0; no peer, no Docker), a model in torchtitan's TP layout
(embedding RowwiseParallel to Shard(1), the block's norm SequenceParallel, its MLP Colwise/Rowwise, the
output ColwiseParallel), the block compiled alone as torchtitan compiles each block. Prints one JSON
object: case -> the embedding's gradient norm (this rank's shard) or the error's "Type: message"; with
``--traceback``, the TP case's traceback as Python prints it (what the job summary reads).

    python tests/tp_compile_check.py                      # about 10 s on 2 cores (aot_eager)
    python tests/tp_compile_check.py --backend inductor   # the same outcome, inductor's compile (~45 s)
    python tests/tp_compile_check.py --device cuda        # on a machine with a GPU (not run here)

Cases: ``tp`` and ``fsdp_tp`` (FSDP2 fully_shard over a dp mesh dim of 1 beside TP 2), each ``eager``,
``compiled`` and ``compiled_plain`` (the embedding's output passed through ``.clone()`` before the compiled
block: a plain tensor, no AsyncCollectiveTensor, enters it). On torch 2.13.0 ``tp/compiled`` raises
``AttributeError: 'Tensor' object has no attribute '_local_tensor'`` in the backward and
``fsdp_tp/compiled`` gives a zero gradient; eager and compiled_plain agree. The values of a fake group's
collectives are not a real run's: only eager against compiled on one group is compared.
"""
from __future__ import annotations

import argparse
import json
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

VOCAB, DIM, HIDDEN = 32, 16, 32


class Block(nn.Module):
    """A pre-norm MLP block: (batch, seq, DIM) -> the same."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.w1, self.w2 = nn.LayerNorm(DIM), nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.w2(torch.relu(self.w1(self.norm(h))))


class Model(nn.Module):
    """Token ids (batch, seq) -> the mean square of the logits (a scalar loss)."""

    def __init__(self, plain: bool) -> None:
        super().__init__()
        self.emb, self.block, self.out, self.plain = nn.Embedding(VOCAB, DIM), Block(), nn.Linear(DIM, VOCAB), plain

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        return self.out(self.block(h.clone() if self.plain else h)).float().pow(2).mean()


def run(case: str, mode: str, backend: str, device: str) -> tuple[object, list[str] | None]:
    """One case's embedding gradient norm, or its error's "Type: message" and the traceback's lines."""
    torch.manual_seed(0)
    model = Model(plain=mode == "compiled_plain").to(device)
    mesh = init_device_mesh(device, (1, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    parallelize_module(model.block, mesh["tp"], {
        "norm": SequenceParallel(), "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1))})
    if case == "fsdp_tp":
        fully_shard(model.block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    if mode != "eager":
        model.block = torch.compile(model.block, backend=backend)
    try:
        model(torch.randint(0, VOCAB, (4, 8), device=device)).backward()
    except Exception as e:  # noqa: BLE001 - the bug's own error is the outcome reported
        return f"{type(e).__name__}: {e}", traceback.format_exc().splitlines()
    return round(float(model.emb.weight.grad.to_local().norm()), 6), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="aot_eager", help="torch.compile's backend (aot_eager, inductor)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a machine with a GPU")
    parser.add_argument("--traceback", action="store_true", help="add the tp/compiled case's traceback lines")
    args = parser.parse_args()
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    out, lines = {}, None
    for case in ("tp", "fsdp_tp"):
        for mode in ("eager", "compiled", "compiled_plain"):
            out[f"{case}/{mode}"], tb = run(case, mode, args.backend, args.device)
            lines = lines or tb
    if args.traceback:
        out["traceback"] = lines
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
