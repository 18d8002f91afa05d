"""The stall watch's published state of one rank and the rules rank 0 reads from every rank's (pure).

    python -c "from simcluster.train.stallstate import beat_s, parse; print(beat_s(512, 60), parse('5.0 7.5 3:12:512'))"

Each rank's watch (train/stallwatch.py) publishes one text under its store key when it changes:
``LAST WAIT [GROUP:SEQ:SIZE,...]``: the UNIX time of its last progress, the time it began waiting in
communication (0: not waiting), and the collectives under way on it (train/commstate.py
``fr_status``: per group its oldest collective enqueued and not completed, and the group's size).

A rank waits; is that a hang? ``under_way``: when every waiting rank waits only in collectives, and
each of those collectives has every rank of its group inside it (as many ranks publish the same
group and sequence number as the group has), the collective is being worked on by the backend (on
an overloaded machine a gloo all-reduce over 512 ranks takes minutes): no rank is missing, so no
hang; the process group's timeout still ends one that never completes. A rank waiting in a
send/recv, or in a collective a member of its group never entered, is what a hang is.

``beat_s``: the watch's period grows with the world (each beat is a store round trip a rank, and
rank 0 reads every rank's key), one second up to 64 ranks, world/64 s beyond (8 s at 512), and
never over a fifth of the stall limit, so that a stall is seen within 20% of --stall-s.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

RANKS_PER_SECOND = 64  # ranks whose beats fit in one second before the period grows


@dataclass(frozen=True)
class RankState:
    """One rank's published state: last_t and wait_since (UNIX s; 0: none), pending: the collectives
    under way, each (group name, sequence number, group size)."""

    last_t: float
    wait_since: float = 0.0
    pending: tuple[tuple[str, int, int], ...] = ()

    def text(self) -> str:
        """The state as published (``parse`` reads it back)."""
        calls = ",".join(f"{g}:{s}:{n}" for g, s, n in self.pending)
        return f"{self.last_t!r} {self.wait_since!r}" + (f" {calls}" if calls else "")


def parse(text: str) -> RankState:
    """A published state back (see ``RankState.text``); a state of the older two-field form reads with no calls."""
    parts = text.split()
    calls = tuple((g, int(s), int(n)) for g, s, n in (c.split(":") for c in parts[2].split(","))) if len(parts) > 2 else ()
    return RankState(float(parts[0]), float(parts[1]) if len(parts) > 1 else 0.0, calls)


def beat_s(world: int, stall_s: float) -> float:
    """The watch's period (s) for a job of ``world`` ranks and a stall limit of ``stall_s`` (see the module)."""
    return max(1.0, min(world / RANKS_PER_SECOND, stall_s / 5))


def under_way(states: list[RankState]) -> tuple[str, int, int] | None:
    """The collective (group name, sequence number, group size) every waiting rank is inside with all
    of its group, when that is so for every waiting rank (the first such, by group name); None when a
    waiting rank waits elsewhere (a send/recv, or a collective a member of its group is not in)."""
    inside = Counter((g, s) for st in states for g, s, _ in st.pending)
    found = None
    for st in states:
        if not st.wait_since:
            continue
        if not st.pending or any(inside[(g, s)] < n or n <= 0 for g, s, n in st.pending):
            return None
        found = min(st.pending + ((found,) if found else ()))
    return found
