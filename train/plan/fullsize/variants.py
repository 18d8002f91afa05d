"""Stated models of what the full-size run cannot execute: torch.compile's fused kernels and torchao's
Float8 linear layers, applied to a recorded (eager, bf16) trace before it is timed.

    python -c "from simcluster.train.plan.fullsize.variants import apply; print(apply.__doc__)"

The full-size run executes the program eagerly under FakeTensorMode: no inductor graph, no Float8
kernel. A published run made with them is predicted from the eager trace by these rules (no
constant fitted to any row; each number's source beside it):

- ``float8`` (torchao's Float8Linear, tensorwise dynamic scaling, as torchtitan converts every
  nn.Linear but the ``output`` layer: torchtitan's float8 converter, ``filter_fqns``): every matmul
  (aten.mm / addmm) recorded inside a TransformerBlock (a phase under ``layers.``) runs on the FP8
  tensor cores, at FP8_SPEEDUP x the bf16 rate with the same MATMUL_EFFICIENCY (its FLOPs counted
  at 1/FP8_SPEEDUP); each such matmul adds its operands' scaling casts, a memory-bound op of
  CAST_BYTES x the matmul's recorded bf16 bytes (each bf16 element read for the amax, read again
  and written at one byte: (2 + 2 + 1) / 2; the recorded bytes include the output, an operand
  shared by several matmuls is charged for each, and under tensor parallelism the gathered operand
  is charged where Float8ColwiseParallel casts the local shard before the gather: an upper bound). Tensor parallelism's sequence-parallel all-gathers inside the blocks move Float8
  (Float8ColwiseParallel casts before it gathers: half the bytes); with ``fsdp_float8`` (torchtitan's
  ``enable_fsdp_float8_all_gather``) FSDP's all-gathers of the blocks' weights move half the bytes.
- ``compile`` (torchtitan compiles each TransformerBlock, fullgraph): inductor fuses the
  memory-bound ops between two compute ops (matmul, attention) or collectives into one kernel that
  keeps the intermediates in registers; modelled as: a run of consecutive memory-bound ops of one
  block and one direction (forward or backward) becomes one op moving the bytes of the largest op
  of the run (its inputs read once, its output written once). Matmuls, attention and collectives
  are unchanged; ops outside the blocks (embedding, output layer, loss, optimizer) stay eager.
- ``compile-loss`` (torchtitan since 2025 compiles its cross-entropy too when compile is on:
  torchtitan/components/loss.py, build_cross_entropy_loss; its December 2024 train.py did not):
  the loss becomes one fused kernel a direction, which reads the bf16 logits and writes the bf16
  gradient; the float32 copies the eager loss makes of the logits (its upcast, log-softmax and
  their gradients: allocations of twice the output layer's largest output, outside the model after
  its forward) are not made. Its time is left as recorded.
- memory otherwise as recorded (the eager allocations). On the published H100 rows compile (blocks
  only) lowered the peak by 5 GiB and Float8 changed it by under 0.3 GiB (torchtitan
  benchmarks/llama3_h100_202412_torchtitan.md Tables 1 and 3); not modelled.
The MFU of a Float8 step is not defined (the page says so: two tensor-core peaks); the FLOPs of the
transformed trace are bf16-equivalent time, not work.
"""
from __future__ import annotations

import dataclasses
import re

from simcluster.train.plan.fullsize.trace import Trace

FP8_SPEEDUP = 2.0  # NVIDIA H100 / H200 datasheets: FP8 3,958 TFLOPS vs BF16 1,979 TFLOPS (both with sparsity)
CAST_BYTES = 2.5  # (2 + 2 + 1) / 2: read for the amax, read and written as one byte, over the bf16 bytes
MATMULS = ("mm", "addmm")
COMPUTE = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
           "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention",
           "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention",
           "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu",
           "_scaled_dot_product_flash_attention_for_cpu_backward", "convolution", "convolution_backward")
SP_GATHER = "all_gather_into_tensor"  # DTensor's (functional) all-gather: tensor parallelism's
FSDP_GATHER = ("allgather_base", "allgather_into_tensor_coalesced", "allgather")
_BLOCK = re.compile(r"layers\.(\d+)")
_OUTPUT = re.compile(r", forward (\S+\.)?output$")  # the output layer's forward


def _block(phase: str) -> str | None:
    """'forward 12' / 'backward 12' for a phase inside TransformerBlock 12, else None."""
    m = _BLOCK.search(phase)
    return None if m is None else f"{'backward' if ', backward ' in phase else 'forward'} {m.group(1)}"


def float8(trace: Trace, fsdp_float8: bool = False) -> Trace:
    """``trace`` with the blocks' linear layers in Float8 (the module docstring's rules)."""
    out = []
    for e in trace.events:
        if e[0] == "op" and e[5] in MATMULS and _block(trace.phases[e[3]]):
            out.append(("op", 0, int(CAST_BYTES * e[2]), e[3], 0, "float8_cast"))
            out.append(("op", int(e[1] / FP8_SPEEDUP), e[2], e[3], 0, e[5] + "_float8"))
        elif e[0] == "c" and _block(trace.phases[e[5]]) and (
                e[1] == SP_GATHER or (fsdp_float8 and e[1] in FSDP_GATHER)):
            out.append((e[0], e[1], e[2] // 2, *e[3:]))
        else:
            out.append(e)
    return dataclasses.replace(trace, events=tuple(out))


def compiled(trace: Trace) -> Trace:
    """``trace`` with the blocks' memory-bound ops fused as inductor would (the module docstring's rule)."""
    out, run, where = [], None, None
    for e in trace.events:
        if e[0] == "op":
            block = _block(trace.phases[e[3]])
            fusable = block is not None and not e[1] and e[5] not in COMPUTE
            if fusable and run is not None and block == where:
                if e[2] > run[2]:
                    run = ("op", 0, e[2], run[3], 0, "fused")
                continue
            if run is not None:
                out.append(run)
            run, where = (("op", 0, e[2], e[3], 0, "fused"), block) if fusable else (None, None)
            if not fusable:
                out.append(e)
        elif e[0] == "c" or e[0] == "tok":
            if run is not None:
                out.append(run)
            run, where = None, None
            out.append(e)
        else:
            out.append(e)  # allocations and frees do not end a fused kernel
    if run is not None:
        out.append(run)
    return dataclasses.replace(trace, events=tuple(out))


def compiled_loss(trace: Trace) -> Trace:
    """``trace`` without the float32 copies of the logits its loss made (the module docstring's rule)."""
    logits = max((e[2] for e in trace.events if e[0] == "a" and _OUTPUT.search(trace.phases[e[3]])), default=0)
    drop = {e[1] for e in trace.events if e[0] == "a" and logits and e[2] == 2 * logits
            and ", outside the model, after the forward of" in trace.phases[e[3]]}
    return dataclasses.replace(trace, events=tuple(e for e in trace.events if not (e[0] in ("a", "f", "r") and e[1] in drop)))


def apply(trace: Trace, techniques: tuple[str, ...]) -> Trace:
    """``trace`` under the named techniques, of ``compile``, ``compile-loss``, ``float8``, ``fsdp-float8``
    (Float8 with FSDP's Float8 all-gather); Float8 first, so that compile fuses its casts with their neighbours.

    Raises:
        ValueError: an unknown technique (the known ones named).
    """
    unknown = set(techniques) - {"compile", "compile-loss", "float8", "fsdp-float8"}
    if unknown:
        raise ValueError(f"unknown technique(s) {sorted(unknown)}: known compile, compile-loss, float8, fsdp-float8")
    if "float8" in techniques or "fsdp-float8" in techniques:
        trace = float8(trace, "fsdp-float8" in techniques)
    if "compile" in techniques:
        trace = compiled(trace)
    if "compile-loss" in techniques:
        trace = compiled_loss(trace)
    return trace
