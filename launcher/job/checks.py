"""Checks of the launcher's input strings, the way Docker and Compose would check them (stdlib and the floor's
core/paths.py only).

    python -c "from simcluster.launcher.job.checks import *; print(image_problem('Simcluster/trainer'), memory_bytes('3g'))"

Every problem is one line naming the option, what is wrong and a valid example (``launcher``
exits 2 with them, before any file is written). The rules:

- text: no option value, job argument or config string holds a control character: C0
  (U+0000-U+001F: newline, tab, ...), DEL, C1 (U+0080-U+009F) or U+2028/U+2029 (YAML reads
  the last four as line breaks too). These values land in the generated document: in its
  header comment (one line), its labels, the run id, bind-mount specs and commands.
- memory: ``N`` bytes (``6291456``, ``12b``) or a decimal number of kibi-, mebi- or gibibytes
  (``512k``, ``1536m``, ``0.5g``, ``3g``; case-insensitive), at least Docker's minimum of 6 MiB
  (its daemon answers ``Minimum memory limit allowed is 6MB``).
- cpus: at least 0.01 (Docker: ``Range of CPUs is from 0.01 to N.00``).
- image: distribution/reference's grammar, ``[HOST[:PORT]/]NAME[:TAG][@DIGEST]``: NAME is
  ``/``-separated components of ``[a-z0-9]+`` joined by ``.``, ``_``, ``__`` or dashes; HOST is
  the first component when it has a ``.`` or a ``:`` or is ``localhost`` (``[::1]`` in brackets);
  TAG ``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``; DIGEST ``ALGO:HEX`` (sha256: 64 hex digits); at most
  255 characters before the tag. Stricter than Docker in one corner: an uppercase first
  component (``Me/trainer``) is refused as an uppercase repository, not read as a registry host.
- run folder: not an existing file, no file where one of its parent folders should be, and no symbolic
  link that loops or leads nowhere in its place or a parent's (mkdir -p fails on it).
"""
from __future__ import annotations

import os
import re
from fractions import Fraction

from simcluster.core.paths import unresolved

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MIN_MEMORY = 6 * 1024 * 1024  # Docker's linuxMinMemory: 6291456 bytes
MIN_GPU_MEMORY = 2**20  # --gpu-memory's floor: below 1 MiB a unit was surely forgotten (24 = 24 bytes)
MIN_CPUS = 0.01
_MEMORY = re.compile(r"(?P<n>(0|[1-9]\d*)(\.\d+)?)(?P<unit>[kmg])|(?P<bytes>[1-9]\d*)b?")
_UNIT = {"k": 2**10, "m": 2**20, "g": 2**30}

_ALNUM = r"[a-z0-9]+"
_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_NAME = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"(?P<algo>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):(?P<hex>[0-9a-fA-F]{32,})")
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
NAME_MAX = 255

# a valid value of each option, for the messages
EXAMPLES = {
    "--run-dir": "runs/mesh-2x2x2", "--data": "data/corpus.txt", "--script": "examples/ddp.py", "--code": "mycode",
    "--mount": "./corpus:/data/corpus:ro", "--module": "mypkg.train", "--image": "simcluster/trainer:latest",
    "--workdir": "/shared/me/simcluster", "--setup": "'module load pytorch'", "--out": "compose/mesh-2x2x2.yml",
    "--container-image": "nvcr.io#nvidia/pytorch:24.05-py3", "--runs-claim": "simcluster-runs",
    "--config": "run.yaml", "--user": "1000:1000", "--memory-per-node": "3g", "--resume": "auto",
}


def example(flag: str) -> str:
    """``--run-dir runs/mesh-2x2x2``: a valid use of flag (``--flag VALUE`` for one without an example)."""
    return f"{flag} {EXAMPLES.get(flag, 'VALUE')}"


def control_char(value: str) -> str | None:
    """``'\\n' (U+000A) at position 3`` for the first control character of value, else None."""
    m = CONTROL.search(value)
    return None if m is None else f"{m.group()!r} (U+{ord(m.group()):04X}) at position {m.start()}"


def text_errors(values: dict[str, object], why: str, fix) -> list[str]:
    """One line per value (a string or a list of strings) that holds a control character.

    values: what the user typed, by the name the message gives it (``--run-dir``); why: what the
    value is part of; fix(name) -> the fix, e.g. ``remove it, e.g. --run-dir runs/mesh-2x2x2``.
    """
    errors = []
    for name, value in values.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, str) and (where := control_char(v)):
                errors.append(f"{name}: {v!r} holds the control character {where}; {why}; {fix(name)}")
    return errors


def memory_bytes(text: str) -> int | None:
    """The bytes of a memory size (see the module docstring), or None when it is not one."""
    m = _MEMORY.fullmatch(str(text).lower())
    if m is None:
        return None
    return int(m.group("bytes")) if m.group("bytes") else int(float(m.group("n")) * _UNIT[m.group("unit")])


_SIZE = re.compile(r"(?P<n>[-+]?\d+(?:\.\d+)?(?:e\d+)?)\s*(?P<unit>|b|[kmgt]|[kmgt]b|[kmgt]ib)", re.ASCII)
_SIZE_UNIT = {"": 1, "b": 1, **{u: 2**(10 * i) for i, u in enumerate("kmgt", 1)},
              **{u + "ib": 2**(10 * i) for i, u in enumerate("kmgt", 1)}, **{u + "b": 10**(3 * i) for i, u in enumerate("kmgt", 1)}}


def size_bytes(text: str) -> int | None:
    """The bytes of a device memory size: a number with a unit (``24GiB``, ``512MiB``, ``24g`` =
    GiB; ``40GB`` = 40 * 10^9 bytes, as GPU datasheets count) or whole bytes; None when it is not one.
    A negative size parses (to a negative int): the caller names that problem; a number too large for a
    float (``1e400GB``) parses exactly (fractions.Fraction), to be refused by its size."""
    m = _SIZE.fullmatch(str(text).strip().lower())
    return None if m is None else int(Fraction(m.group("n")) * _SIZE_UNIT[m.group("unit")])


def gpu_memory_problem(text: str, gpu: str | None) -> str | None:
    """Why --gpu-memory TEXT cannot be the memory of one simulated GPU of model ``gpu`` (None: the
    default model), else None."""
    from simcluster.launcher.instrument.spec import DEFAULT_GPU
    from simcluster.core.hardware import GPU_ALIASES, HARDWARE
    gpu = gpu or DEFAULT_GPU
    size, most = size_bytes(text), int(HARDWARE[GPU_ALIASES.get(gpu, gpu)].memory)
    if size is None:
        return (f"--gpu-memory: {text!r} is not a size; write a number with a unit, e.g. --gpu-memory 24GiB "
                f"(or 512MiB, 40GB = 40 * 10^9 bytes)")
    if size <= 0:
        return f"--gpu-memory: {text!r} is {size} bytes; a device holds more than 0, e.g. --gpu-memory 24GiB"
    if size < MIN_GPU_MEMORY:
        bare = re.fullmatch(r"\d+(\.\d+)?", str(text).strip())
        return (f"--gpu-memory: {text!r} is {size} bytes (a number without a unit counts bytes), below 1 MiB, the "
                f"least a simulated GPU holds; e.g. --gpu-memory {text.strip() if bare else 24}GiB")
    if size > most:
        size = size if size < 10**20 else f"over 10^{len(str(size)) - 1}"
        return (f"--gpu-memory: {text!r} is {size} bytes, above the --gpu {gpu} model's {most} bytes "
                f"({most / 2**30:.2f} GiB); give at most that, e.g. --gpu-memory 24GiB, or a larger --gpu")
    return None


def memory_problem(text: str) -> str | None:
    """Why --memory-per-node TEXT cannot be a Docker memory limit, else None."""
    size = memory_bytes(text)
    if size is None:
        return (f"{text!r} is not a size; write whole bytes or a number with k, m or g (KiB, MiB, GiB), "
                f"e.g. --memory-per-node 3g, 1536m or 0.5g")
    if size < MIN_MEMORY:
        return (f"{text!r} is {size} bytes, below Docker's minimum memory limit of 6 MiB ({MIN_MEMORY} bytes; "
                f"Docker answers 'Minimum memory limit allowed is 6MB'); e.g. --memory-per-node 512m")
    if size >= 2**63:
        return f"{text!r} is more bytes than Docker can hold (2^63); e.g. --memory-per-node 64g"
    return None


def image_problem(image: str) -> str | None:
    """Why image is not an image reference Docker accepts (see the module docstring), else None."""
    if not image:
        return "it is empty"
    if re.search(r"\s", image):
        return "holds whitespace, which no image reference has"
    if image.startswith("/"):
        return "starts with '/'; a reference is [HOST[:PORT]/]NAME[:TAG], never a path"
    rest, _, digest = image.partition("@")
    first, slash, after = rest.partition("/")
    host = first if slash and ("." in first or ":" in first or first == "localhost") else ""
    if host:
        rest = after
        if not _HOST.fullmatch(host):
            return f"registry host {host!r} is not HOST[:PORT] (letters, digits, dashes and dots; a numeric port)"
    if "::" in rest:
        return "it has '::'; a single ':' goes between the name and its tag"
    name, colon, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not name:
        return "has no repository name before its tag"
    if name != name.lower() and _NAME.fullmatch(name.lower()):
        return f"repository name {name!r} has uppercase letters; repository names are lowercase"
    if not _NAME.fullmatch(name):
        return (f"repository name {name!r} is not /-separated components of a-z and 0-9 joined by '.', '_', "
                f"'__' or '-' (no ':' or '//' inside, none at either end)")
    if len(host) + bool(host) + len(name) > NAME_MAX:
        return f"name is longer than {NAME_MAX} characters"
    if colon and not _TAG.fullmatch(tag):
        return (f"tag {tag!r} is not 1 to 128 of letters, digits, '_', '.' and '-' (not starting with '.' or "
                f"'-')")
    if digest:
        m = _DIGEST.fullmatch(digest)
        want = _DIGEST_HEX.get(m.group("algo")) if m else None
        if m is None or (want is not None and len(m.group("hex")) != want):
            return f"digest {digest!r} is not ALGORITHM:HEX, e.g. sha256: and 64 hex digits"
    return None


def run_dir_problem(path: str) -> str | None:
    """Why the run folder path cannot be a folder (it is a file, or a parent of it is, or it or a parent is a
    symbolic link to nothing), else None."""
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        return f"{full} exists and is not a folder"
    parent = full
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        if loose := unresolved(parent):  # mkdir -p and os.makedirs fail on it ('File exists', ELOOP)
            return f"{parent} is {loose}{'' if parent == full else f', on the way to {full}'}"
        parent = os.path.dirname(parent)
    if os.path.exists(parent) and not os.path.isdir(parent):
        return f"{parent}, a parent of {full}, is a file"
    return None


def out_problem(path: str, mine: str = "") -> str | None:
    """Why generate cannot write its file at path (a folder is there, or a parent is a file, or a file that does not
    holds something but not ``mine``, the header line of generate's documents, in its first 4 KiB: a file of yours),
    else None."""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        return f"{full} is a folder; name the file to write"
    if mine and os.path.isfile(full):
        try:
            with open(full, "rb") as fh:
                head = fh.read(4096)
        except OSError as e:
            return f"{full} cannot be read ({e.strerror}) to see whether generate wrote it"
        if head and mine.encode() not in head:  # an empty file holds nothing to lose
            return (f"{full} exists and generate did not write it (no {mine.strip()!r}... line in its head), so it is "
                    f"left as it is; name a new file, or remove that one first")
    if loose := unresolved(full):  # written, it would replace the link
        return f"{full} is {loose}; name a file"
    if why := run_dir_problem(os.path.dirname(full)):
        return why
    parent = os.path.dirname(full)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent}, where {full} would be made, cannot be written to"
    return None
