"""The CPU bridge of FlexAttention's backward: torch's own uncompiled path, let through on the CPU.

    python -m simcluster.launcher.instrument.flex_cpu      # prints the largest |flex - SDPA| of out and grads

The gap (torch 2.13): ``flex_attention`` refuses any input that requires grad on the CPU
(``NotImplementedError: FlexAttention does not support backward on CPU``) in its device check,
before it runs. Its uncompiled path (the eager higher-order op, whose backward is torch's dense
math) computes the backward on any device; the bridge replaces only that check, so a CPU tensor
that requires grad takes it (every other check stays torch's). Run uncompiled: a
``torch.compile``d flex_attention's backward on CPU is still refused by inductor. The bridged
result equals ``F.scaled_dot_product_attention``'s (its math backend, the same dense computation;
CPU's fused SDPA kernel differs from both by up to 1e-6 in float32) within 5e-7
(tests/test_simulated_gpus.py).
"""
from __future__ import annotations


def install(flex) -> None:
    """Let CPU inputs that require grad through ``flex``'s (torch.nn.attention.flex_attention) device check."""
    inner = flex._validate_device
    if hasattr(inner, "__simulated__"):
        return

    def validate(query, key, value) -> None:
        if query.device.type == "cpu":
            return  # torch's only refusal for the CPU is the backward this bridge lets through
        inner(query, key, value)
    validate.__simulated__ = inner
    flex._validate_device = validate


def largest_difference(causal: bool = True) -> float:
    """max |flex - SDPA (math backend)| over the output and the grads of q, k, v (float32, (2, 4, 64, 16))."""
    import warnings

    import torch
    import torch.nn.functional as F
    import torch.nn.attention.flex_attention as flex
    from torch.nn.attention import SDPBackend, sdpa_kernel

    install(flex)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16, generator=g, requires_grad=True) for _ in range(3))
    mask = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 64, 64, device="cpu") if causal else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that uncompiled flex_attention materializes the scores
        out = flex.flex_attention(q, k, v, block_mask=mask)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    with torch.no_grad():
        return max(float((a - b).abs().max()) for a, b in zip((out, *grads), (ref, *ref_grads)))


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="the largest |flex_attention - SDPA| of out and grads on CPU, "
                                        "causal then not").parse_args()
    print(largest_difference(True), largest_difference(False))
