"""Units the host side and the planner both read: tc's rates (``100mbit``).

    python -c "from simcluster.train.units import rate_bits_per_s; print(rate_bits_per_s('100mbit'))"
"""
from __future__ import annotations

import re

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)")
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
