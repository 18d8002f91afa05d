"""A path that does not resolve, named in one set of words for every input that takes a path (a mount's source,
--out, --run-dir, a run folder to read, diagnose's folder).

    python -c "from simcluster.core.paths import unresolved; print(unresolved('/no/such/run', 'nothing there'), unresolved('/'))"

os.path.exists follows links, so a link to itself (ELOOP) or to a target that is gone reads as nothing there,
though os.makedirs, open(..., 'w') and a bind mount all fail on it or write through it.
"""
from __future__ import annotations

import os

LOOSE_LINK = "a symbolic link that loops or leads nowhere"


def unresolved(path: str, absent: str | None = None, *, target: bool = True) -> str | None:
    """What stands at PATH when it does not resolve, as words to put after "PATH is" or in parentheses.

    Args:
        path: any path, relative to the cwd or absolute.
        absent: the caller's words for nothing there at all (e.g. "nothing there", "no such folder"); None: a
            path with nothing there is not this check's business.
        target: name the link's target (os.readlink's text, quoted) after the words.

    Returns:
        ``LOOSE_LINK`` + " ('TARGET')" for a symbolic link whose target is missing or that loops; ``absent``
        when nothing is there; None when the path resolves (a file, a folder, a link to either).
    """
    if os.path.exists(path):
        return None
    if not os.path.islink(path):
        return absent
    if not target:
        return LOOSE_LINK
    try:
        return f"{LOOSE_LINK} ({os.readlink(path)!r})"
    except OSError:  # removed between the two calls
        return LOOSE_LINK
