"""Your code's dependencies, as the job describes them: a requirements file and wheels (frozen), checked
and content-addressed; engines/deps_image.py builds the image they name.

    python -c "from simcluster.launcher.job.deps import Requirements; print(bool(Requirements()), Requirements().tag('sha256:0'))"
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from simcluster.train.errors import ConfigError

REPO = "simcluster/deps"  # the derived images' repository: simcluster/deps:<key>
EXAMPLE = "e.g. --requirements requirements.txt (one requirement a line, as pip reads it)"
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


@dataclass(frozen=True)
class Requirements:
    """What a job needs beyond the trainer image. file: a requirements file (host path) or None; wheels:
    wheel files built by the user (host paths). Empty: the trainer image itself runs."""

    file: str | None = None
    wheels: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.file is not None or bool(self.wheels)

    def check(self) -> None:
        """Raises ConfigError: the file or a wheel is missing, unreadable or not a wheel file."""
        if self.file is not None and not (os.path.isfile(self.file) and os.access(self.file, os.R_OK)):
            raise ConfigError(f"requirements: {self.file!r} is not a readable file; {EXAMPLE}")
        for path in self.wheels:
            if not (os.path.isfile(path) and os.access(path, os.R_OK) and WHEEL.match(os.path.basename(path))):
                raise ConfigError(f"wheel: {path!r} is not a readable wheel file (NAME-VERSION-...-PLATFORM.whl); "
                                  f"e.g. --wheel dist/mypkg-0.1-py3-none-any.whl")

    def tag(self, base_id: str) -> str:
        """The derived image's tag for a base image id: content-addressed, see the module's rules."""
        h = hashlib.sha256(base_id.encode() + b"\0")
        for path in ([self.file] if self.file else []) + sorted(self.wheels, key=os.path.basename):
            with open(path, "rb") as fh:
                h.update(os.path.basename(path).encode() + b"\0" + hashlib.sha256(fh.read()).digest())
        return f"{REPO}:{h.hexdigest()[:16]}"
