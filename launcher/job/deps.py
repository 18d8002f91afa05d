"""Your code's dependencies, as the job describes them: a requirements file and wheels (frozen), checked
and content-addressed; engines/deps_image.py builds the image they name.

    python -c "from simcluster.launcher.job.deps import Requirements; print(bool(Requirements()), Requirements().tag('sha256:0'))"

The requirements file is read here only as far as pip's own format says what it pulls in (lines, ``\\``
continuations, comments, ``-r``/``-c`` includes relative to their file): binary wheels only, so pip never
runs a build backend or clones a repository on the host. A line naming a local project folder, an sdist
archive, a VCS URL (``git+``, ``hg+``, ``svn+``, ``bzr+``) or an editable install (``-e``) is refused with
the fix (build its wheel yourself and pass ``--wheel``); a file with no requirement in it, an include that
is missing or that includes itself again are refused, and so is a file whose every requirement has a
marker that excludes the image's Python (IMAGE_MARKERS: nothing would be installed). Everything else (names, versions, markers,
hashes, index options) is pip's to judge: engines/deps_image.py names pip's own reason and the line.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from simcluster.core.errors import ConfigError

REPO = "simcluster/deps"  # the derived images' repository: simcluster/deps:<key>
EXAMPLE = "e.g. --requirements requirements.txt (one requirement a line, as pip reads it)"
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
INCLUDE = re.compile(r"^(-r|--requirement|-c|--constraint)(?:\s*=?\s*|\s+)(?P<path>\S+)$")
EDITABLE = re.compile(r"^(-e|--editable)(\s|=|$)")
VCS = re.compile(r"(^|[\s@])(git|hg|svn|bzr)\+[a-z]+:", re.I)
ARCHIVE = re.compile(r"\.(tar\.gz|tgz|tar\.bz2|tar\.xz|tar|zip)(#\S*)?$", re.I)
IMAGE_PYTHON = "3.11"  # the trainer image's interpreter (images/Dockerfile: BASE_IMAGE provides python3 3.11)
IMAGE_MARKERS = {"python_version": IMAGE_PYTHON, "python_full_version": IMAGE_PYTHON + ".2", "os_name": "posix",
                 "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                 "implementation_name": "cpython", "platform_python_implementation": "CPython"}
BUILD_FIX = "build its wheel yourself (pip wheel --no-deps -w dist PROJECT) and pass --wheel dist/NAME-VERSION-...whl"


@dataclass(frozen=True)
class Line:
    """One logical line of a requirements file: its file (host path), its first line number, its text
    (continuations joined, the comment dropped)."""

    file: str
    number: int
    text: str

    def where(self) -> str:
        return f"{self.file} line {self.number}: {self.text!r}"


def _logical(path: str) -> list[Line]:
    """The logical lines of one file, as pip joins them. Raises ConfigError: unreadable, not text."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        text = raw.decode("utf-8")
    except OSError as e:
        raise ConfigError(f"requirements: cannot read {path!r} ({e.strerror}); {EXAMPLE}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"requirements: {path!r} is not a requirements file (not UTF-8 text); {EXAMPLE}") from None
    if "\0" in text:
        raise ConfigError(f"requirements: {path!r} is not a requirements file (it holds NUL bytes); {EXAMPLE}")
    lines, parts, first = [], [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if not parts:
            first = number
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        joined = re.sub(r"(^|\s)#.*$", "", "".join(parts) + line).strip()
        parts = []
        if joined:
            lines.append(Line(path, first, joined))
    return lines


def _local_project(line: Line) -> str | None:
    """Why this requirement line would make pip build or clone on the host, or None."""
    text = line.text
    if text.startswith("--no-binary"):
        return "--no-binary makes pip build source distributions on the host"
    if EDITABLE.match(text):
        return "an editable install (-e) builds the project on the host"
    if VCS.search(text):
        return "a VCS URL makes pip clone the repository and build it on the host"
    target = text.split(" @ ", 1)[1].strip() if " @ " in text else text.split()[0]
    if target.startswith("-"):
        return None
    target = re.sub(r"[;\s].*$", "", target)
    if ARCHIVE.search(target):
        return "a source archive is built on the host"
    local = target[len("file://"):] if target.startswith("file://") else target
    if target.startswith("file:") or "/" in local or local in (".", "..") or local.startswith("~"):
        path = os.path.join(os.path.dirname(line.file), os.path.expanduser(local))
        if os.path.isdir(path) or not local.endswith(".whl"):
            return "a local project folder is built on the host"
    return None


def read_lines(path: str) -> tuple[Line, ...]:
    """Every logical line of a requirements file and its ``-r``/``-c`` includes, in pip's order.

    Raises:
        ConfigError: a file unreadable or not text, an include missing or in a cycle, a line that pip
        would build or clone (a local project, an sdist, a VCS URL, ``-e``), or no requirement at all.
    """
    out: list[Line] = []

    def visit(file: str, chain: tuple[str, ...]) -> None:
        for line in _logical(file):
            m = INCLUDE.match(line.text)
            if m:
                inc = os.path.normpath(os.path.join(os.path.dirname(file), m["path"]))
                if "://" in m["path"]:
                    raise ConfigError(f"requirements: {line.where()} includes a URL; download it and include the "
                                      f"file (e.g. -r base.txt)")
                if not os.path.isfile(inc):
                    raise ConfigError(f"requirements: {line.where()} includes {inc!r}, which is not a file; fix the "
                                      f"path (relative to the including file), e.g. -r base.txt")
                if os.path.realpath(inc) in chain:
                    raise ConfigError(f"requirements: {line.where()} includes {inc!r} again (an include cycle: "
                                      f"{' -> '.join(chain + (os.path.realpath(inc),))}); drop one of the includes")
                out.append(line)
                visit(inc, chain + (os.path.realpath(inc),))
                continue
            why = _local_project(line)
            if why:
                raise ConfigError(f"requirements: {line.where()}: {why}, and wheels are binary only here; {BUILD_FIX}")
            out.append(line)

    visit(path, (os.path.realpath(path),))
    reqs = [ln for ln in out if not ln.text.startswith("-") and not _constraint(ln, out)]
    if not reqs:
        raise ConfigError(f"requirements: {path!r} holds no requirement (only comments, blank lines, options or "
                          f"constraints); add one a line (e.g. tqdm==4.67.1) or drop --requirements")
    if not any(_applies(ln) for ln in reqs):
        raise ConfigError(f"requirements: every requirement of {path!r} has a marker that excludes the image's Python "
                          f"(CPython {IMAGE_PYTHON}, Linux x86-64), e.g. {reqs[0].where()}, so nothing would be "
                          f"installed; fix the markers (e.g. ; python_version >= \"3.10\") or drop --requirements")
    return tuple(out)


def _constraint(line: Line, lines: list[Line]) -> bool:
    """Whether a line came from a ``-c`` file (a constraint: it installs nothing)."""
    for inc in lines:
        m = INCLUDE.match(inc.text)
        if m and m.group(1) in ("-c", "--constraint") and \
                os.path.normpath(os.path.join(os.path.dirname(inc.file), m["path"])) == os.path.normpath(line.file):
            return True
    return False


def _applies(line: Line) -> bool:
    """Whether a requirement line's marker holds in the image (IMAGE_MARKERS); a line packaging cannot
    parse counts as holding (pip judges it and names its own reason)."""
    from packaging.requirements import InvalidRequirement, Requirement

    text = re.split(r"\s--?[a-z]", line.text, maxsplit=1)[0]  # per-line options (--hash=...) off
    try:
        marker = Requirement(text).marker
    except InvalidRequirement:
        return True
    try:
        return marker is None or marker.evaluate(IMAGE_MARKERS)
    except Exception:  # noqa: BLE001 - an undefined marker name: pip's to judge
        return True


def included(path: str) -> tuple[str, ...]:
    """The files a requirements file pulls in with ``-r``/``-c`` (itself first, each once, in order)."""
    files = [path]
    for line in read_lines(path):
        m = INCLUDE.match(line.text)
        if m:
            inc = os.path.normpath(os.path.join(os.path.dirname(line.file), m["path"]))
            if inc not in files:
                files.append(inc)
    return tuple(files)


@dataclass(frozen=True)
class Requirements:
    """What a job needs beyond the trainer image. file: a requirements file (host path) or None; wheels:
    wheel files built by the user (host paths). Empty: the trainer image itself runs."""

    file: str | None = None
    wheels: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.file is not None or bool(self.wheels)

    def check(self) -> None:
        """Raises ConfigError: the file or a wheel is missing, unreadable or not a wheel file; the file's
        lines as ``read_lines`` refuses them."""
        if self.file is not None:
            if not (os.path.isfile(self.file) and os.access(self.file, os.R_OK)):
                raise ConfigError(f"requirements: {self.file!r} is not a readable file; {EXAMPLE}")
            read_lines(self.file)
        for path in self.wheels:
            if not (os.path.isfile(path) and os.access(path, os.R_OK) and WHEEL.match(os.path.basename(path))):
                raise ConfigError(f"wheel: {path!r} is not a readable wheel file (NAME-VERSION-...-PLATFORM.whl); "
                                  f"e.g. --wheel dist/mypkg-0.1-py3-none-any.whl")

    def tag(self, base_id: str, recipe: str = "") -> str:
        """The derived image's tag for a base image id: content-addressed (the base's id, the recipe that
        builds it, the bytes of the requirements file and of every file it includes, each wheel's name
        and bytes)."""
        h = hashlib.sha256(base_id.encode() + b"\0" + recipe.encode() + b"\0")
        files = included(self.file) if self.file else ()
        for path in list(files) + sorted(self.wheels, key=os.path.basename):
            with open(path, "rb") as fh:
                h.update(os.path.basename(path).encode() + b"\0" + hashlib.sha256(fh.read()).digest())
        return f"{REPO}:{h.hexdigest()[:16]}"
