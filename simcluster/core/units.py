"""Units the host side and the planner both read: tc's rates (``100mbit``).

    python -c "from simcluster.core.units import rate_bits_per_s; print(rate_bits_per_s('100mbit'))"
"""
from __future__ import annotations

import re

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)", re.ASCII)  # tc reads 0-9 only
_RATE_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


MAX_BITS = 1e15  # 1 Pbit/s: a larger rate is a typo (tc's own rates are 64-bit bytes/s)


def rate_bits_per_s(text: str) -> float | None:
    """tc's rate units (``100mbit``, ``1gbit``, ``12.5mbps`` = bytes/s) -> bits per second; None
    when ``text`` does not parse, is not > 0 or is above MAX_BITS (1 Pbit/s; an overflow to inf
    too)."""
    m = _RATE.fullmatch(str(text).strip().lower())
    if not m or float(m.group(1)) <= 0:
        return None
    bits = float(m.group(1)) * _RATE_BITS[m.group(2)]
    return bits if bits <= MAX_BITS else None  # beyond any link (and inf: a number overflowing a float)


# What tc tbf (launcher/drills/shaping.py tbf_command: burst max(64 KiB, 20 ms of the rate)) holds, measured
# with iproute2 in simcluster/nettools: below 8bit (1 byte/s) tc refuses the rate ('the "rate" parameter is
# mandatory'); below about 2kbit it cuts the 64 KiB burst to what fits its 275 s buffer, under one packet at
# a few hundred bit/s, so nothing passes; above about 1.7tbit the burst no longer fits tc's 32 bits
# ('illegal value for "burst"'). TC_MIN_BITS and TC_MAX_BITS keep a margin inside both.
TC_MIN_BITS = 4e3  # 4kbit: the 64 KiB burst held (tc prints 'burst 64Kb lat 50ms')
TC_MAX_BITS = 1e12  # 1tbit: a burst of 2.5 GB, inside tc's 32-bit burst


def tc_rate_problem(flag: str, text: str) -> str | None:
    """Why ``text`` cannot be the rate of ``flag`` (``--inter-node-bandwidth``) that tc tbf applies,
    naming the value and a valid example with the flag; None when it can (4kbit to 1tbit)."""
    bits = rate_bits_per_s(text)
    if bits is None:
        return (f"{text!r} is not a tc rate; write a number and a unit of bit, kbit, mbit, gbit (or bps, "
                f"kbps, mbps, gbps for bytes/s), e.g. {flag} 100mbit")
    if not TC_MIN_BITS <= bits <= TC_MAX_BITS:
        side = "below 4kbit, where tc tbf drops every packet or refuses the rate" if bits < TC_MIN_BITS else \
            "above 1tbit, where tc tbf's 32-bit burst cannot hold 20 ms of it"
        return f"{text!r} is {bits:g} bit/s, {side}; give a rate from 4kbit to 1tbit, e.g. {flag} 100mbit"
    return None
