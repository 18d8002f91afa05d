"""pip's own reason, out of what ``pip download`` wrote to stderr, and the requirement line it names (pure).

    python -c "from simcluster.launcher.job.pip_errors import reason; print(reason('ERROR: No matching distribution found for nope'))"

pip writes its reason in several shapes: ``ERROR:`` lines with indented detail (a hash mismatch, a
conflict's "The conflict is caused by:" block), a traceback after ``ERROR: Exception:`` whose last line
is the exception (an invalid marker in pip 23), and ``WARNING:`` lines that say why nothing was found (an
index that refused the connection, a find-links folder that does not exist). The reason keeps each of
them, once, and drops the warnings that name locations of the host's own pip configuration.
"""
from __future__ import annotations

import re

from simcluster.launcher.job.deps import Line

KEPT_WARNINGS = re.compile(r"Retrying|Connection|connection|Could not fetch URL|is ignored|SSLError|"
                           r"HTTPError|404|403|401|timed out", re.I)


def reason(stderr: str, locations: tuple[str, ...] = ()) -> str:
    """pip's reason, one line a fact, joined by ``; ``. locations: the index and find-links locations the
    user's files name (a ``Location ... is ignored`` warning is kept only for those)."""
    lines = stderr.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("ERROR: Exception:"):
            tail = [ln for ln in lines[i + 1:] if ln.strip() and not ln.startswith((" ", "Traceback"))]
            out.append(tail[-1].split(": ", 1)[-1] if tail else line)
            break
        if line.startswith("ERROR:") or line.startswith("The conflict is caused by:"):
            block = [line.removeprefix("ERROR: ").strip()]
            while i + 1 < len(lines) and lines[i + 1].startswith(" ") and lines[i + 1].strip():
                i += 1
                block.append(lines[i].strip())
            if not block[0].startswith("ResolutionImpossible"):
                out.append(" ".join(block))
        elif line.startswith("WARNING:") and KEPT_WARNINGS.search(line):
            if "is ignored" in line and not any(loc in line for loc in locations):
                pass  # the host's own pip configuration, not the user's file
            else:
                text = re.sub(r" object at 0x[0-9a-f]+", "", line.removeprefix("WARNING: ").strip())
                text = re.sub(r"^Retrying \(Retry\(total=\d+.*?\)\) after ", "", text)
                if text not in out:
                    out.append(text)
        i += 1
    return "; ".join(out) or stderr.strip()[-600:]


LOCATION_LINE = re.compile(r"^(-i|--index-url|--extra-index-url|-f|--find-links)(?:\s*=?\s*|\s+)(\S+)$")
LOCATION_TROUBLE = re.compile(r"connection|Could not fetch URL|is ignored|SSLError|HTTPError|\b40[134]\b|timed out|"
                              r"Name or service not known|Temporary failure in name resolution", re.I)


def named_line(why: str, lines: tuple[Line, ...]) -> Line | None:
    """The user's line pip's reason is about: when the reason is an index or find-links location that
    failed (a refused connection, a folder that is not there), the option line naming that location (the
    only one, or the one the reason quotes), never the requirement after it; else a requirement line
    whose text (or whose name) the reason quotes, the most specific first; None when it names none."""
    if LOCATION_TROUBLE.search(why):
        options = [ln for ln in lines if LOCATION_LINE.match(ln.text)]
        quoted = [ln for ln in options if LOCATION_LINE.match(ln.text).group(2) in why]
        if quoted or len(options) == 1:
            return (quoted or options)[0]
    reqs = [ln for ln in lines if not ln.text.startswith("-")]
    for ln in reqs:
        if ln.text in why or any(part.strip() and part.strip() in why for part in ln.text.split(";")):
            return ln
    for ln in reqs:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", ln.text)
        if name and re.search(rf"(?<![\w.-]){re.escape(name.group(0))}(?![\w-])", why, re.I):
            return ln
    return None


def locations(lines: tuple[Line, ...]) -> tuple[str, ...]:
    """The index URLs and find-links locations the user's files name."""
    out = []
    for ln in lines:
        m = LOCATION_LINE.match(ln.text)
        if m:
            out.append(m.group(2))
    return tuple(out)


def clash(why: str, fixed: dict[str, str]) -> str | None:
    """The package and the constraint that clash, when pip's reason is a conflict with a fixed package:
    ``oldstack 1.0 needs fsspec<=2024.6.1, and the image fixes fsspec>=0.8.5``. fixed: {normalised
    name: the constraint that fixes it (torch==2.13.0+cpu, fsspec>=0.8.5, ...)}."""
    spec = r"(?:\[[^\]]*\])?(?P<want>[<>=!~][^\s;)]*)"
    for name, constraint in fixed.items():
        pkg = re.escape(name).replace("\\-", "[-_.]")
        for pat, who in ((rf"(?P<who>[\w.-]+ [\w.+!-]+) depends on {pkg}{spec}", None),
                         (rf"The user requested {pkg}{spec}", "your requirements"),
                         (rf"satisfies the requirement {pkg}{spec} \(from (?P<who>[^)]*)\)", None)):
            m = re.search(pat, why, re.I)
            if m:
                needs = f"{who or m['who']} needs {name}{m['want']}"
                return f"{needs}, and the image's torch is {constraint}" if name == "torch" else \
                    f"{needs}, and the image fixes {constraint} (torch itself requires it)"
    return None
