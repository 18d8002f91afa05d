"""The fused wqkv and w13 projections: a tp shard of their rows computes exactly its slice.

    python -m pytest -q tests/test_fused_projections.py

Column-parallel TP gives rank r the r-th contiguous block of a weight's rows. These tests take
that block by hand (no process group) and check that it yields rank r's heads of q, k, v and
rank r's hidden units of the SwiGLU, i.e. the same numbers the unsharded module computes there.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from simcluster.core.config import PRESETS
from simcluster.train.model import Attention, FeedForward


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_w13_shard_is_its_hidden_units(tp):
    torch.manual_seed(0)
    args = PRESETS["tiny"]  # dim 64, ffn 128, 4 heads
    full = FeedForward(args.dim, args.ffn_dim, groups=args.n_heads)
    x = torch.randn(2, 5, args.dim)
    hidden = full.w13(x).unflatten(-1, (-1, 2, full.group_width))
    acts = (F.silu(hidden[..., 0, :]) * hidden[..., 1, :]).flatten(-2)  # (2, 5, ffn) in unit order
    # the same activations from separate w1 / w3 weights gathered out of the fused layout
    w = full.w13.weight.view(args.n_heads, 2, full.group_width, args.dim)
    w1, w3 = w[:, 0].reshape(args.ffn_dim, args.dim), w[:, 1].reshape(args.ffn_dim, args.dim)
    torch.testing.assert_close(acts, F.silu(x @ w1.T) * (x @ w3.T), rtol=1e-5, atol=1e-6)
    rows, units = 2 * args.ffn_dim // tp, args.ffn_dim // tp
    for r in range(tp):
        local = (x @ full.w13.weight[r * rows:(r + 1) * rows].T).unflatten(-1, (-1, 2, full.group_width))
        torch.testing.assert_close((F.silu(local[..., 0, :]) * local[..., 1, :]).flatten(-2),
                                   acts[..., r * units:(r + 1) * units], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_wqkv_shard_is_whole_heads(tp):
    torch.manual_seed(0)
    args = PRESETS["tiny"]
    attn = Attention(args)
    x = torch.randn(2, 5, args.dim)
    q, k, v = attn.wqkv(x).view(2, 5, args.n_heads, 3, attn.head_dim).unbind(3)
    heads, rows = args.n_heads // tp, 3 * args.dim // tp
    for r in range(tp):
        local = (x @ attn.wqkv.weight[r * rows:(r + 1) * rows].T).view(2, 5, -1, 3, attn.head_dim)
        assert local.shape[2] == heads
        for got, want in zip(local.unbind(3), (q, k, v)):
            torch.testing.assert_close(got, want[:, :, r * heads:(r + 1) * heads], rtol=1e-6, atol=1e-7)
