"""Units the host side and the planner both read: tc's rates (``100mbit``).

    python -c "from simcluster.train.units import rate_bits_per_s; print(rate_bits_per_s('100mbit'))"
"""
from __future__ import annotations

import re

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)")
_RATE_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


def rate_bits_per_s(text: str) -> float | None:
    """tc's rate units (``100mbit``, ``1gbit``, ``12.5mbps`` = bytes/s) -> bits per second; None
    when ``text`` does not parse or is not > 0."""
    m = _RATE.fullmatch(str(text).strip().lower())
    if not m or float(m.group(1)) <= 0:
        return None
    return float(m.group(1)) * _RATE_BITS[m.group(2)]
