"""A GPT-2 from Hugging Face transformers, built from its config (no weights downloaded), split into
pipeline stages with torch.distributed.pipelining: one stage a rank, GPipe, a DCP checkpoint saved to a
relative path; a GPU script as written for GPUs (cuda, nccl), run on the simulated GPUs unchanged.

    python -m launcher up --nodes 2 --nproc-per-node 2 --script examples/frameworks/hf_pipeline/train.py \
        --requirements examples/frameworks/hf_pipeline/requirements.txt -- --steps 6
    torchrun --nproc-per-node 4 examples/frameworks/hf_pipeline/train.py --steps 6    # on 4 GPUs, transformers installed

Every rank builds the same model from the same seed, keeps its stage's modules (the embeddings on
the first, a contiguous run of blocks, the final norm and the LM head on the last) and runs
``ScheduleGPipe`` over ``--microbatches``; the activations cross ranks (and nodes) with
``PipelineStage``'s sends. The last stage prints ``step N/M loss X``; every stage saves its own
parameters into ``checkpoint/`` of the working directory (keys named by the global block index, so
the stages' shards never collide).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, SEQ = 64, 32


class Stage(nn.Module):
    """Blocks lo..hi-1 of the model, with the embeddings (first stage) or the norm and head (last)."""

    def __init__(self, model: GPT2LMHeadModel, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        body = model.transformer
        self.wte, self.wpe = (body.wte, body.wpe) if first else (None, None)
        self.blocks = nn.ModuleDict({str(i): body.h[i] for i in range(lo, hi)})
        self.ln_f, self.lm_head = (body.ln_f, model.lm_head) if last else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:  # (microbatch, SEQ) ids -> (microbatch, SEQ, n_embd)
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)  # causal self-attention: no mask given, GPT-2's attention is causal
        if self.lm_head is not None:  # -> (microbatch, SEQ, VOCAB) logits
            x = self.lm_head(self.ln_f(x))
        return x


def batch(step: int, size: int) -> torch.Tensor:
    """The same global batch on every rank: counting sequences modulo VOCAB, a pattern to learn."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    return (start + torch.arange(SEQ + 1)) % VOCAB


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=args.layers, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    per = args.layers // world
    lo, hi = rank * per, args.layers if rank == world - 1 else (rank + 1) * per
    stage_mod = Stage(model, lo, hi, first=rank == 0, last=rank == world - 1).to(device)
    del model
    stage = PipelineStage(stage_mod, stage_index=rank, num_stages=world, device=device)
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=3e-3)
    for step in range(1, args.steps + 1):
        ids = batch(step, args.batch).to(device)
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(ids[:, :-1])
        elif rank == world - 1:
            schedule.step(target=ids[:, 1:], losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
        if rank == world - 1:
            print(f"step {step}/{args.steps} loss {torch.stack(losses).mean().item():.4f}", flush=True)
    dcp.save({"model": stage_mod.state_dict()}, checkpoint_id="checkpoint")
    dist.barrier()
    if rank == world - 1:
        print("saved checkpoint", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
