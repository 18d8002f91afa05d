"""The pipeline stage split: a pure function from (layers, stages) to each stage's layer ids.

    python -c "from simcluster.train.split import split_layers; print(split_layers(8, 3))"   # [[0, 1], [2, 3, 4], [5, 6, 7]]
"""
from __future__ import annotations


def split_layers(n_layers: int, n_stages: int) -> list[list[int]]:
    """Contiguous, as-even-as-possible layer ids per pipeline stage.

    When the layers do not divide evenly, the extra layers go to the middle stages first, so the
    first stage (which also holds the embedding) and the last (final norm, head and loss) hold
    fewer. Example: 8 layers on 3 stages -> [[0, 1], [2, 3, 4], [5, 6, 7]].

    Raises:
        ValueError: n_stages < 1 or n_layers < n_stages (every stage needs a layer).
    """
    if n_stages < 1 or n_layers < n_stages:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} stages; need n_layers >= stages >= 1")
    base, extra = divmod(n_layers, n_stages)
    # middle-out priority: stages nearest the centre get the extra layers first
    centre = (n_stages - 1) / 2
    order = sorted(range(n_stages), key=lambda s: (abs(s - centre), -s))
    sizes = [base + (s in order[:extra]) for s in range(n_stages)]
    out, start = [], 0
    for size in sizes:
        out.append(list(range(start, start + size)))
        start += size
    return out


def stage_ids(pp_rank: int, pp: int, local_stages: int, layout: str) -> list[int]:
    """Global stage indices held by one pp rank.

    layout "single": [pp_rank]; "loop": round-robin, rank r holds r, r+pp, r+2pp, ...
    (interleaved 1F1B, looped BFS); "v": rank r holds r and 2*pp-1-r (ZBV, DualPipeV).
    """
    if layout == "single":
        return [pp_rank]
    if layout == "loop":
        return [pp_rank + k * pp for k in range(local_stages)]
    if layout == "v":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    raise ValueError(f"unknown stage layout {layout!r}")
