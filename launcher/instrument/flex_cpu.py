"""The CPU bridge of FlexAttention's backward: torch's own uncompiled path, let through on the CPU.

    python -m simcluster.launcher.instrument.flex_cpu      # |flex - SDPA| and both against float64, out and grads

The gap (torch 2.13): ``flex_attention`` refuses any input that requires grad on the CPU
(``NotImplementedError: FlexAttention does not support backward on CPU``) in its device check,
before it runs. Its uncompiled path (the eager higher-order op, whose backward is torch's dense
math) computes the backward on any device; the bridge replaces only that check, so a CPU tensor
that requires grad takes it (every other check stays torch's). Run uncompiled: a
``torch.compile``d flex_attention's backward on CPU is still refused by inductor. The bridged
result equals ``F.scaled_dot_product_attention``'s (its math backend, the same dense computation;
CPU's fused SDPA kernel differs from both by up to 1e-6 in float32) within 5e-7 of each tensor's
scale (relative: an absolute 5e-7 is below float32's spacing for gradients above 4), with or
without a causal block mask, and is as close to the float64 result as SDPA is
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


def differences(causal: bool = True) -> dict[str, tuple[float, float, float]]:
    """Flex against SDPA (math backend) and both against float64, for out, dq, dk, dv.

    Inputs: q, k, v float32 of shape (2, 4, 64, 16), seeded; a causal block mask or none.
    Returns {name: (|flex - SDPA| / scale, |flex - f64| / scale, |SDPA - f64| / scale)}, each the
    largest over the tensor's entries, scale = max(1, the float64 tensor's largest |entry|): a
    relative difference, since float32's spacing grows with the value (4.8e-7 between 4 and 8).
    """
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
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
        exact = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
        exact_grads = torch.autograd.grad(exact.sum(), (q64, k64, v64))
    result = {}
    with torch.no_grad():
        for name, a, b, c in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads), (exact, *exact_grads)):
            scale = max(1.0, float(c.abs().max()))
            result[name] = tuple(float((x.double() - y.double()).abs().max()) / scale for x, y in ((a, b), (a, c), (b, c)))
    return result


def largest_difference(causal: bool = True) -> float:
    """max over out, dq, dk, dv of |flex - SDPA (math backend)| relative to the tensor's scale (``differences``)."""
    return max(flex_sdpa for flex_sdpa, _, _ in differences(causal).values())


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="the largest |flex_attention - SDPA| of out and grads on CPU, "
                                        "causal then not").parse_args()
    for causal in (True, False):
        for name, (flex_sdpa, flex_exact, sdpa_exact) in differences(causal).items():
            print(f"{'causal' if causal else 'no mask'} {name}: |flex - SDPA| {flex_sdpa:.2e}, "
                  f"|flex - float64| {flex_exact:.2e}, |SDPA - float64| {sdpa_exact:.2e} (relative)")
