"""Models: a Llama-style decoder LM and the ``seed`` toy Linear stack, both stage-splittable.

    python -c "from train.model import build_model; from simcluster.core.config import PRESETS; print(build_model(PRESETS['tiny']))"

Both keep their blocks in ``layers``, an ``nn.ModuleDict`` keyed by the global layer index, and
treat a missing ``tok_embeddings`` / ``norm`` / ``output`` (set to None by ``prune_to_stage``) as
identity, so a pipeline stage is the full model with the other stages' parts deleted and its
parameter names (FQNs) equal to the full model's. That is what makes init and checkpoints mesh-free.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from simcluster.core.config import ModelArgs


@functools.lru_cache(maxsize=8)
def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of rotary position embedding, each (seq_len, head_dim), float32, CPU.

    Always real tensors, whatever mode the first caller runs under: the planner's fake-tensor pass
    (train/plan/shapes.py) must not leave FakeTensors in this cache for a later real run of the
    same process (they raised DataDependentOutputException at its first ``float(loss)``).

    Source: Su et al., "RoFormer" (2021), rotate-half form as in Llama.
    """
    with unset_fake_temporarily():
        return _rope_tables(seq_len, head_dim, theta)


def _rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device="cpu"), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, seq, heads, head_dim) by position; cos/sin (seq, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE through ``F.scaled_dot_product_attention``.

    One fused projection ``wqkv`` (3*dim, dim) whose rows are grouped by head: head h owns rows
    [3*h*head_dim, 3*(h+1)*head_dim) = its q, k and v rows. A column (row-of-weight) shard over tp
    is then whole heads, for any tp dividing n_heads, and each rank sees n_heads/tp heads; the head
    count is read from the projected width, never from args.
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.rope_theta = args.rope_theta
        self.wqkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, dim) -> (batch, seq, dim)."""
        bs, seq, _ = x.shape
        q, k, v = self.wqkv(x).view(bs, seq, -1, 3, self.head_dim).unbind(3)  # each (bs, seq, heads, head_dim)
        cos, sin = (t.to(x.device) for t in rope_tables(seq, self.head_dim, self.rope_theta))  # cached on CPU
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x). Source: Shazeer, "GLU Variants Improve Transformer" (2020).

    w1 and w3 are one fused projection ``w13`` (2*hidden, dim) whose rows come in ``groups``
    blocks, each [w1's rows of hidden units g*hidden/groups ...; w3's rows of the same units]. A
    column (row-of-weight) shard over tp is then whole blocks for any tp dividing ``groups`` (the
    model uses n_heads, which tp divides already), and gate and up stay contiguous runs of
    hidden/groups values; interleaving single rows instead made the elementwise SwiGLU strided
    (the MLP's forward and backward 9-12% slower in one process).
    """

    def __init__(self, dim: int, hidden: int, groups: int):
        super().__init__()
        self.group_width = hidden // groups
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., dim) -> (..., dim); under tp each rank holds hidden/tp of the hidden units."""
        gate, up = self.w13(x).unflatten(-1, (-1, 2, self.group_width)).unbind(-2)  # (..., groups, width)
        return self.w2((F.silu(gate) * up).flatten(-2))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim, args.n_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Llama-style decoder LM. tokens (batch, seq) int64 -> logits (batch, seq, vocab) float32.

    A pipeline stage without the embedding takes hidden states (batch, seq, dim) instead, and one
    without the head returns them.
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


class ResidualPair(nn.Module):
    """x + w2(relu(w1 x)): one Linear pair of the seed model, dim -> hidden -> dim."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.relu(self.w1(x)))


class SeedBlock(nn.Module):
    """The original toy script's block: a 32->32->32 pair, then a 32->64->32 pair."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.pair1 = ResidualPair(args.dim, args.dim)
        self.pair2 = ResidualPair(args.dim, args.ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pair2(self.pair1(x))


class SeedNet(nn.Module):
    """The ``seed`` preset: features (batch, 32) float -> class logits (batch, 10)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.tok_embeddings = None  # inputs are features already
        self.layers = nn.ModuleDict({str(i): SeedBlock(args) for i in range(args.n_layers)})
        self.norm = None
        self.output = nn.Linear(args.dim, args.vocab_size)

    forward = Transformer.forward


def build_model(args: ModelArgs) -> nn.Module:
    """A fresh model of the given shape on the current default device (use ``torch.device('meta')``)."""
    return SeedNet(args) if args.kind == "seed" else Transformer(args)


def prune_to_stage(model: nn.Module, layer_ids: list[int], is_first: bool, is_last: bool) -> nn.Module:
    """Keep only the given layers (plus embedding if first, norm and head if last); in place."""
    keep = {str(i) for i in layer_ids}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if not is_first:
        model.tok_embeddings = None
    if not is_last:
        model.norm = None
        model.output = None
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy. logits (..., vocab) float; targets (...) int64 -> scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
