"""Typing a mapping of Config fields (a parsed YAML file, or flags): every value of the wrong type
refused at once, each naming the field and a fix. Torch-free.

    python -c "from simcluster.core.config_types import config_from_dict; print(config_from_dict({'steps': 5}).steps)"

Accepted: an int for an int field (a float only when it is whole, 3.0), an int or a float for a
float field, and numeric text for either (PyYAML reads ``lr: 3e-4`` as the text '3e-4'); a
number for a text field (``run_dir: 2024``). Refused: a boolean anywhere (YAML ``steps: true``,
``resume: yes``), other text where a number is expected, a list or a mapping where one value is,
and an empty value for a field that needs one. Ranges (nan, inf, negatives) are preflight's.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, fields

from simcluster.core.config import Config
from simcluster.core.errors import ConfigError

EXAMPLES = {"int": "100", "float": "0.003", "str": "text"}


def _describe(v) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()} (a YAML boolean)"
    if isinstance(v, (list, tuple)):
        return f"a list {v!r}"
    if isinstance(v, dict):
        return f"a mapping {v!r}"
    return f"{v!r} ({'text' if isinstance(v, str) else type(v).__name__})"


def coerce(name: str, kind: str, v):
    """One value as field ``name`` of type ``kind`` (int | float | str).

    Raises:
        ValueError: a message naming the field, the value and a fix.
    """
    fix = f"write one {kind} value, e.g. {name}: {EXAMPLES[kind]}"
    if isinstance(v, (bool, list, tuple, dict)) or not isinstance(v, (int, float, str)):
        hint = "; quote it ('yes') for text" if isinstance(v, bool) and kind == "str" else ""
        raise ValueError(f"field {name} must be {kind}, got {_describe(v)}; {fix}{hint}")
    if kind == "str":
        return str(v)
    if isinstance(v, str):
        try:
            v = float(v.strip()) if kind == "float" else int(v.strip())
        except ValueError:
            try:  # "1e3" for an int field: numeric text, judged as the number below
                v = float(v.strip())
            except ValueError:
                raise ValueError(f"field {name} must be {kind}, got {_describe(v)}; {fix}") from None
    if kind == "float":
        return float(v)
    if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
        raise ValueError(f"field {name} must be an integer, got {v!r}; {fix}")
    return int(v)


def config_from_dict(values: dict, source: str = "config") -> Config:
    """Build a Config from a mapping (a parsed YAML file, or the flags the user set).

    Raises:
        ConfigError: unknown keys, or every value of the wrong type, one per line, each
            prefixed by ``source`` (the YAML path or "flags").
    """
    names = {f.name for f in fields(Config)}
    unknown = sorted(set(map(str, values)) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(names))}")
    spec = {f.name: f for f in fields(Config)}
    out, errors = {}, []
    for k, v in values.items():
        f = spec[k]
        kind = f.type.split("|")[0].strip()
        if v is None:
            if "None" in f.type:
                out[k] = None
            else:
                default = f.default if f.default is not MISSING else EXAMPLES[kind]
                errors.append(f"field {k} is empty; give it a {kind} value (default {default}) or delete the line")
            continue
        try:
            out[k] = coerce(k, kind, v)
        except ValueError as e:
            errors.append(str(e))
    if errors:
        raise ConfigError("\n  ".join(f"{source}: {e}" for e in errors))
    return Config(**out)
