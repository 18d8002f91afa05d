"""HF accelerate's ND parallelism (ParallelismConfig: dp_replicate x dp_shard x tp, i.e. HSDP x FSDP2 x TP)
with bf16 autocast on a tiny Llama from transformers, built from its config (no download), trained on
tinyshakespeare read bytewise; a GPU script as written for GPUs, run on the simulated GPUs unchanged.

    python -m launcher up --nodes 2 --nproc-per-node 4 --script examples/frameworks/accelerate_nd/train.py \
        --requirements examples/frameworks/accelerate_nd/requirements.txt --mount /work/shared/data:/data -- --steps 6
    torchrun --nproc-per-node 8 examples/frameworks/accelerate_nd/train.py --data DATA_DIR/tinyshakespeare.txt  # 8 GPUs

The mesh is (dp_replicate, dp_shard, tp) = (--dp-replicate, --dp-shard, --tp), its product the world.
Each decoder block's attention and MLP are split across the tp ranks (torch's ColwiseParallel /
RowwiseParallel on accelerate's own "tp" submesh) before ``accelerator.prepare``, which then shards
the model with FSDP2 over (dp_replicate, dp_shard) (HSDP when dp_replicate > 1). Every tp group reads
the same batch (tokens are bytes: vocabulary 256). Rank 0 prints what accelerate found
(``accelerate: FSDP on cuda, 8 processes, mesh {...}``) and ``step N/M loss X`` (the mean over ranks).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQ = 256, 64


def batches(path: str, rank: int, groups: int, batch: int, steps: int) -> list[torch.Tensor]:
    """`steps` batches of (batch, SEQ + 1) byte ids for data-parallel group `rank` of `groups`."""
    data = torch.tensor(list(open(path, "rb").read()[: 400_000]), dtype=torch.long)
    gen = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - SEQ - 1, (groups, batch), generator=gen)[rank]
        out.append(torch.stack([data[s: s + SEQ + 1] for s in starts.tolist()]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dp-replicate", type=int, default=2)
    p.add_argument("--dp-shard", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="sequences per data-parallel group and step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--data", default="/data/tinyshakespeare.txt", help="a text file, read as bytes")
    args = p.parse_args()

    pc = ParallelismConfig(dp_replicate_size=args.dp_replicate, dp_shard_size=args.dp_shard, tp_size=args.tp)
    fsdp = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                          transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    accelerator = Accelerator(parallelism_config=pc, fsdp_plugin=fsdp, mixed_precision="bf16")
    mesh = accelerator.torch_device_mesh
    accelerator.print(f"accelerate: {accelerator.distributed_type.value} on {accelerator.device.type}, "
                      f"{accelerator.num_processes} processes, mesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}")

    torch.manual_seed(0)  # the same initial weights on every rank
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                         tie_word_embeddings=False)
    config.distributed_config = {"tp_size": args.tp}  # what accelerate reads to check the model's tp degree
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:  # heads and MLP columns split across the tp ranks
        parallelize_module(layer, mesh["tp"], {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)

    dp_rank = accelerator.process_index // args.tp  # the mesh is row-major, tp innermost
    data = batches(args.data, dp_rank, args.dp_replicate * args.dp_shard, args.batch, args.steps)
    for step, ids in enumerate(data, start=1):
        ids = ids.to(accelerator.device)
        with accelerator.autocast():
            logits = model(input_ids=ids[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        loss = accelerator.reduce(loss.detach(), reduction="mean")
        accelerator.print(f"step {step}/{args.steps} loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
