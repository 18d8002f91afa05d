"""The fields of a job request, read from their one declaration (job/sections.py): each option's Spec
by name; one value checked (``check_value``) or converted from command-line text (``from_text``).

    python -c "from simcluster.launcher.job.fields import FIELDS, check_value; print(check_value('steps', 3), FIELDS['nodes'])"

Pure and argparse-free: the request (request.py) checks every keyword with it, and the CLI's text
is typed by it, so both refuse a bad value with one message: the field, the value and an example.
A bool is no int, an int field refuses floats and text, a float field takes an int but never a
non-finite number (nor an int too large for a float), a list field refuses a mapping or a string, a text
field an empty or blank text (not --setup: an empty shell line; --image: its own check), which would otherwise
stand for its default.
A value checked against a table at the door (--target: the engines) is text here.
"""
from __future__ import annotations

import math

from simcluster.launcher.job.sections import (MAX_INT, MAX_STEPS, EngineOptions, GenerateOptions,  # noqa: F401
                                              JobOptions, NodeOptions, Spec, TrainerOptions, UpOptions, specs)
from simcluster.core.errors import ConfigError

SECTIONS = (TrainerOptions, JobOptions, NodeOptions, EngineOptions, UpOptions, GenerateOptions)
# every field, in the command line's order (the header's regenerate line lists them so)
FIELDS: dict[str, Spec] = {name: s for section in SECTIONS for name, s in specs(section).items()}
assert len(FIELDS) == sum(len(specs(s)) for s in SECTIONS), "two sections declare one name"
UP_ONLY = tuple(specs(UpOptions))
EMPTY_TEXT_OK = ("setup", "image")  # --setup: an empty shell line sets nothing up; --image: job/checks.py image_problem
# refuses an empty one in its own words
GENERATE_ONLY = tuple(specs(GenerateOptions))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def example(name: str) -> str:
    """``steps=3 (--steps 3)``: a valid value of the field, as a keyword and as a flag."""
    ex = FIELDS[name].example
    if FIELDS[name].kind == "bool":
        return f"{name}=True ({flag(name)})"
    if FIELDS[name].kind == "pairs":
        return f"{name}={ex!r} ({' '.join(f'{flag(name)} {k}={v}' for k, v in ex.items())})"
    if FIELDS[name].kind == "strs":
        return f"{name}=[{ex!r}] ({flag(name)} {ex})"
    return f"{name}={ex!r} ({flag(name)} {ex})"


def _bad(name: str, value, need: str) -> ConfigError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    e = ConfigError(f"{name}: must be {need}, got {shown}; e.g. {example(name)}")
    e.field = name
    return e


def _num(bound) -> str:
    """A bound as written: an int as it is (2**63 - 1 whole), a float in %g (1e+06, 0.01)."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _number(name: str, spec: Spec, value):
    kind = {"int": "an int", "float": "a finite number"}[spec.kind]
    need = kind
    if spec.lo is not None:
        need = f"{'>' if spec.strict_lo else '>='} {_num(spec.lo)}"
        need += f" and <= {_num(spec.hi)}" if spec.hi is not None else ""
        need += f"{spec.unit} ({kind})"
    if isinstance(value, bool) or not isinstance(value, (int, float) if spec.kind == "float" else int):
        raise _bad(name, value, need)
    if spec.kind == "float":
        try:
            value = float(value)
        except OverflowError:  # an int beyond a float's range
            raise _bad(name, value, need) from None
        if not math.isfinite(value):
            raise _bad(name, value, need)
    elif abs(value) > MAX_INT:  # beyond a 64-bit int (the trainer's, torch's): the range said when no bound is
        raise _bad(name, value, need if spec.lo is not None else f"an int from {-MAX_INT} to {MAX_INT} (64 bits)")
    if spec.lo is not None and (value < spec.lo or (spec.strict_lo and value == spec.lo)):
        raise _bad(name, value, need)
    if spec.hi is not None and value > spec.hi:
        raise _bad(name, value, need)
    return value


def check_values(names, options: dict) -> dict:
    """Each field of names checked (check_value), its value from options (unset: None), by name.

    Raises:
        ConfigError: the first field refused (check_value's message).
    """
    return {n: check_value(n, options.get(n)) for n in names}


def check_value(name: str, value):
    """One field's value, checked and normalised (an int for a float field -> float, a list -> tuple,
    start_late's mapping -> sorted (node, seconds) pairs); None (unset) passes for any field.

    Raises:
        ConfigError: naming the field, the value and an example (``e.field`` is the field's name).
    """
    spec = FIELDS[name]
    if value is None:
        return spec.default
    if spec.kind == "bool":
        if not isinstance(value, bool):
            e = ConfigError(f"{name}: a switch ({flag(name)}): pass True or False, got {value!r}")
            e.field = name
            raise e
        return value
    if spec.kind in ("int", "float"):
        return _number(name, spec, value)
    if spec.kind == "str":
        if not isinstance(value, str):
            raise _bad(name, value, "text")
        if not value.strip() and name not in EMPTY_TEXT_OK:  # never read as unset: the default would run unsaid
            raise _bad(name, value, f"text, not empty or blank (to take the default, leave {flag(name)} out)")
        if spec.choices and value not in spec.choices:
            raise _bad(name, value, f"one of {', '.join(spec.choices)}")
        return value
    if spec.kind == "strs":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise _bad(name, value, "a list of text (a mapping or a string is not flattened)")
        return tuple(value)
    if isinstance(value, dict):  # pairs: start_late
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.partition("=")[::2] for v in value]
    else:
        raise _bad(name, value, "a mapping NODE -> seconds")
    out = []
    for node, sec in items:
        if isinstance(sec, str):
            sec = from_text(name, sec, kind="float") if sec.strip() else None
        if not isinstance(node, str) or not node or sec is None or isinstance(sec, bool) \
                or not isinstance(sec, (int, float)) or not math.isfinite(sec) or sec < 0 or sec > 86400:
            raise _bad(name, value, "a mapping NODE -> seconds in 0..86400")
        if any(node == seen for seen, _ in out):
            raise _bad(name, value, f"each node once ({node} is given twice: one start-late per node, e.g. "
                                    f"--start-late {node}={sec:g})")
        out.append((node, float(sec)))
    return tuple(sorted(out))


def from_text(name: str, text: str, kind: str | None = None):
    """Command-line text -> the field's value (``"3"`` -> 3 for an int field), or the text itself.

    Raises:
        ConfigError: text that is no number of the field's kind, with check_value's message.
    """
    kind = kind or FIELDS[name].kind
    if kind not in ("int", "float") or not isinstance(text, str):
        return text
    try:
        return int(text.strip()) if kind == "int" else float(text.strip())
    except ValueError:
        pass
    if kind == FIELDS[name].kind:
        check_value(name, text)  # raises its message: text is no number
    raise _bad(name, text, "a number")
