"""Context parallel's ring attention in a full-size trace: the collectives torch's ring issues get kinds
of their own, so that speed.py prices them as what they move and variants.py leaves them alone.

    python -m pytest -q -n 0 tests/test_fullsize_cp.py

torch 2.13's context parallel (torch/distributed/tensor/experimental/_context_parallel/_attention.py)
runs attention as a ring over the CP group: ``_templated_ring_attention`` (forward) and
``_templated_ring_attention_backward`` bring every CP rank's K/V block to each rank, either by one
all-gather of them all (``_AllGatherRotater``, the rotate method "allgather", torch's and torchtitan's
default) or by a permute to the next rank at each step (``_AllToAllRotater``, "alltoall":
``permute_tensor``, an ``all_to_all_single`` whose whole input goes to one peer); the backward sends
the K/V gradients on round the ring by permutes whichever the method. While either function runs the
recorder names them:

- CP_GATHER: the all-gather of K/V; bytes its output's (every CP rank's block), priced as a ring all-gather;
- CP_PERMUTE: a permute; bytes its input's, all of it sent to one peer, priced as a send.

torch's fake_collectives counts an ``all_to_all_single`` as its input plus its output (a TODO there):
for a permute that is twice what leaves the rank. Outside the ring these ops keep torch's names
(tensor parallelism's all-gathers, which Float8 halves in variants.py; an MoE's all-to-all).
"""
from __future__ import annotations

from collections.abc import Callable

CP_GATHER = "cp_all_gather"
CP_PERMUTE = "cp_permute"
RING_FUNCTIONS = ("_templated_ring_attention", "_templated_ring_attention_backward")


def kind(name: str, args: tuple, nbytes: int) -> tuple[str, int]:
    """The (kind, bytes) a collective recorded inside CP's ring is given: ``name`` is the functional op's
    (``all_gather_into_tensor``, ``all_to_all_single``), ``args`` its arguments (an all_to_all_single's:
    input, output_split_sizes, input_split_sizes, group), ``nbytes`` torch's count; another op is left as is."""
    if name == "all_gather_into_tensor":
        return CP_GATHER, nbytes
    if name == "all_to_all_single" and len(args) > 2 and sum(1 for s in args[2] if s) == 1:
        return CP_PERMUTE, args[0].numel() * args[0].element_size()
    return name, nbytes


def wrap(counter) -> Callable[[], None]:
    """Wrap torch's two ring functions so that ``counter.ring`` is above 0 while one runs (they are looked
    up by name in their module at each call: torch's SDPA handlers and launcher/instrument/cp_ring.py's
    CPU ones alike); returns the function that puts torch's back. A torch without them: nothing wrapped."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    except ImportError:
        return lambda: None
    saved = {name: getattr(cp, name) for name in RING_FUNCTIONS if hasattr(cp, name)}

    def inside(orig):
        def ring(*args, **kwargs):
            counter.ring += 1
            try:
                return orig(*args, **kwargs)
            finally:
                counter.ring -= 1
        return ring

    for name, orig in saved.items():
        setattr(cp, name, inside(orig))

    def restore() -> None:
        for name, orig in saved.items():
            setattr(cp, name, orig)
    return restore
