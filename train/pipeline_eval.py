"""Forward-only pipeline evaluation: the stages run in order without a schedule, activations
passed by send/recv on the pp group. Used for validation under zbv and dualpipev, whose torch
2.13 schedules fail in ``eval`` (their action lists hold backward actions, "2I0", that an
eval run has no gradients for).

    python -m train --mesh 2x1x1 --model tiny --schedule zbv --steps 2 --val-every 1

Every rank walks the global stages 0 .. n_stages-1 and runs those it holds: it receives the
input of a stage from the holder of the stage before (unless it holds that one too), and sends
the output on to the holder of the next. A chain, so blocking send/recv cannot deadlock. The
whole dp shard goes through as one batch: the mean loss equals the schedule's mean over equal
microbatches (up to float rounding).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from simcluster.train.split import stage_ids


@torch.no_grad()
def forward_only(modules: list[nn.Module], ids: list[int], n_stages: int, local_stages: int, layout: str,
                 group: dist.ProcessGroup, inputs: torch.Tensor | None, targets: torch.Tensor | None,
                 hidden_shape: tuple[int, ...], loss_fn: Callable) -> list[torch.Tensor]:
    """Run this rank's stages forward on one dp shard; returns [loss] where the last stage is held.

    inputs: stage 0's input (batch, seq) int64 (LM) or (batch, dim) float (seed), where held.
    targets: (batch, seq) / (batch,) int64, where the last stage is held.
    hidden_shape: a stage boundary's activation, (batch, seq, dim) or (batch, dim), float32.
    """
    pp, me = group.size(), group.rank()
    holder = {s: r for r in range(pp) for s in stage_ids(r, pp, local_stages, layout)}
    local = dict(zip(ids, modules))
    x, losses = inputs, []
    for s in range(n_stages):
        if holder[s] != me:
            continue
        if s > 0 and holder[s - 1] != me:
            x = torch.empty(hidden_shape, dtype=torch.float32, device=next(local[s].parameters()).device)
            dist.recv(x, group=group, group_src=holder[s - 1])
        y = local[s](x)
        if s == n_stages - 1:
            losses.append(loss_fn(y, targets))
        elif holder[s + 1] != me:
            dist.send(y.contiguous(), group=group, group_dst=holder[s + 1])
        x = y
    return losses
