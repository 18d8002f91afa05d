"""Every input of `launcher plan --full-size` checked before a rank starts (launcher/fullsize.py runs them):
your program (--script or --module, found by --python from --code), the layout, --python (an interpreter
that imports torch), --ranks, --trace-dir and --search --knob; each refused naming the flag, the value and
a fix (ConfigError, exit 2). An empty value is refused, never read as the flag's default.

    python -c "from simcluster.launcher.fullsize_checks import which_ranks; print(which_ranks('0,3', 4))"
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from simcluster.core.errors import ConfigError

MAX_WORLD = 2**31 - 1  # a full-size world's ranks: torch's process groups hold rank and size as C ints
EXAMPLE = ("python -m launcher plan --full-size --script examples/fullsize/tiny.py --nodes 1 --nproc-per-node 2 "
           "--gpu h100-96g -- --steps 2")
FLAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a program's own flag, without its dashes
PROBE_S = 120  # --python started once: it must answer within this


def which_ranks(text: str | None, world: int) -> list[int]:
    """--ranks: 'all', or comma-separated ranks in 0..world-1, each once; default the first and the last.

    Raises:
        ConfigError: an empty item, a rank out of range or named twice, not a number.
    """
    if text is None:
        return sorted({0, world - 1})
    if text == "all":
        return list(range(world))
    items = text.split(",")
    try:
        given = [int(x) for x in items]
    except ValueError:
        given = []
    ranks = sorted(set(given))
    if len(ranks) < len(given):
        raise ConfigError(f"ranks: {text!r} names a rank twice; name each once, e.g. --ranks {','.join(map(str, ranks))}")
    if not ranks or not all(0 <= r < world for r in ranks):
        raise ConfigError(f"ranks: {text!r} is not 'all' or ranks in 0..{world - 1} separated by commas; "
                          f"e.g. --ranks 0,{world - 1}")
    return ranks


def check(args: argparse.Namespace) -> tuple[int, int]:
    """Every input of a full-size plan checked before anything starts; (world size, ranks a node).

    Raises:
        ConfigError: naming the flag, the value and a fix.
    """
    for name, flag, example in (("python", "--python", ".venv/bin/python"), ("trace_dir", "--trace-dir",
                                                                           "runs/fullsize-traces")):
        if getattr(args, name, None) is not None and not getattr(args, name).strip():
            raise ConfigError(f"{name}: {flag} {getattr(args, name)!r} is empty; give one, e.g. {flag} {example}, "
                              f"or drop {flag} for its default")
    if bool(args.script) == bool(args.module):
        raise ConfigError(f"full_size: needs your program, --script FILE or --module NAME (one of them); e.g. {EXAMPLE}")
    nodes, per = (1 if n is None else n for n in (args.nodes, args.nproc_per_node))
    if nodes < 1 or per < 1:
        raise ConfigError(f"nodes/nproc_per_node: must be >= 1, got --nodes {nodes} --nproc-per-node {per}; e.g. {EXAMPLE}")
    if nodes * per > MAX_WORLD:
        raise ConfigError(f"nodes/nproc_per_node: --nodes {nodes} x --nproc-per-node {per} is {nodes * per} ranks, "
                          f"beyond torch's (a rank is a C int: 1 to {MAX_WORLD} ranks); e.g. {EXAMPLE}")
    if args.code and not os.path.isdir(args.code):
        raise ConfigError(f"code: {args.code!r} is not a folder; give your code's folder, e.g. --code examples")
    if args.python:
        _check_python(args.python)
    if why := _program_problem(args):
        raise ConfigError(f"{why}; e.g. {EXAMPLE}")
    if args.requirements:
        raise ConfigError("requirements: a full-size plan runs your code on this host's interpreter; install them into "
                          "a virtual environment and name its interpreter, e.g. --python .venv/bin/python "
                          "(python -m venv --system-site-packages .venv && .venv/bin/pip install -r requirements.txt)")
    return nodes * per, per


def _check_python(python: str) -> None:
    """--python is an executable that runs Python and imports torch (each rank runs under it)."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise ConfigError(f"python: {python!r} is not an executable interpreter; e.g. --python .venv/bin/python")
    try:
        proc = subprocess.run([python, "-c", "import sys, torch; print('simcluster-probe', sys.version_info[0])"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PROBE_S)
        said = proc.stdout.strip().splitlines()[-1:] == ["simcluster-probe 3"]
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}, printed {proc.stdout.strip()[:80]!r}"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        said, why = False, str(e)
    if not said:
        raise ConfigError(f"python: {python!r} is not a Python interpreter that imports torch ({why}); each rank runs "
                          f"under it; e.g. --python .venv/bin/python (a virtual environment with torch)")


def _program_problem(args: argparse.Namespace) -> str | None:
    """Why --script is no Python file, or --module is no module --python finds from --code (or here)."""
    if args.script:
        path = os.path.join(args.code or ".", args.script)
        if not os.path.exists(path):
            return f"script: {args.script!r} not found{' under ' + args.code if args.code else ''}"
        if not (os.path.isfile(path) and args.script.endswith(".py")):
            return f"script: {args.script!r} is {'a folder' if os.path.isdir(path) else 'not a .py file'}; give a Python file"
        return None
    if not all(part.isidentifier() for part in args.module.split(".")):
        return f"module: {args.module!r} is not a dotted module name (identifiers joined by '.')"
    proc = subprocess.run([args.python or sys.executable, "-c", "import importlib.util, sys; "
                           "sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)", args.module],
                          cwd=args.code or os.getcwd(), capture_output=True, text=True, timeout=PROBE_S)
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["not found"])[-1]
        return (f"module: {args.module!r} cannot be imported by {args.python or 'this interpreter'} from "
                f"{args.code or 'here'} ({said}); give --code DIR holding it, or --python with it installed")
    return None


def knob(args) -> tuple[str, list[str]] | None:
    """--search --knob NAME=V1,V2,...: the program's flag --NAME and its values, in the order given.

    Raises:
        ConfigError: --knob without --search or --search without it, a NAME that is no flag name, an
            empty value, a value given twice, numbers out of increasing order.
    """
    if not args.search and not args.knob:
        return None
    text = args.knob or ""
    name, eq, values = text.partition("=")
    vals = values.split(",")
    if not (args.search and eq and name and not name.startswith("-") and any(vals)):
        raise ConfigError(f"knob: --full-size --search needs --knob NAME=V1,V2,... (your program's own flag --NAME, "
                          f"without its dashes, and the values to try, smallest first), got {text or 'none'!r}"
                          f"{'' if args.search else ' without --search'}; "
                          f"e.g. --search --knob training.local-batch-size=1,2,4")
    if not FLAG_NAME.fullmatch(name) or not all(v.strip() for v in vals):
        raise ConfigError(f"knob: {text!r}: {'an empty value' if FLAG_NAME.fullmatch(name) else repr(name) + ' is no flag name'}"
                          f"; give NAME=V1,V2 with a flag name of letters, digits, '.', '_' or '-' and no empty value, "
                          f"e.g. --knob training.local-batch-size=1,2,4")
    nums = [float(v) for v in vals] if all(v.replace(".", "", 1).isdigit() for v in vals) else None
    if len(set(vals)) < len(vals) or (nums is not None and nums != sorted(nums)):
        raise ConfigError(f"knob: {text!r}: the values are tried smallest first and the last that fits is named, so "
                          f"give each once, in increasing order; e.g. --knob {name}="
                          f"{','.join(sorted(set(vals), key=float) if nums is not None else dict.fromkeys(vals))}")
    return f"--{name}", vals
