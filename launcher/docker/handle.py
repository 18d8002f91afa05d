"""What ``status``, ``logs``, ``down`` and ``chaos`` act on: a compose file, its project name and
its host run folder (or a swarm stack's file and name: ``chaos`` only).

    python -c "from simcluster.launcher.docker.handle import Handle; print(Handle.for_run('runs/mesh-2x2x2'))"
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
from dataclasses import dataclass

from simcluster.launcher.container.layout import LABEL
from simcluster.launcher.job.files import ROOT, host_abspath
from simcluster.core.errors import ConfigError
from simcluster.core.paths import unresolved


def sanitize_project(name: str) -> str:
    """A compose project name both versions accept: lowercase [a-z0-9_-], starting alphanumeric."""
    name = re.sub(r"[^a-z0-9_-]", "", name.lower()).lstrip("-_")
    return name or "simcluster"


@dataclass(frozen=True)
class Handle:
    """A compose file, its project name, its host run folder (None until known); with stack, a
    swarm stack file and the stack's name (``launcher up --target swarm``)."""

    file: str
    project: str
    run_dir: str | None
    stack: bool = False

    @classmethod
    def for_run(cls, run_dir: str) -> "Handle":
        """The handle of a ``launcher up`` run folder: RUN_DIR/compose.yml, project
        sc-<folder name>-<6 hex digits of the folder's absolute path>: two run folders of one name
        (a/run, b/run) are two projects, so neither `up` touches the other's containers."""
        run_dir = os.path.abspath(host_abspath(run_dir))
        tag = hashlib.sha1(run_dir.encode()).hexdigest()[:6]
        return cls(os.path.join(run_dir, "compose.yml"),
                   sanitize_project(f"sc-{os.path.basename(run_dir)}-{tag}"), run_dir)

    @classmethod
    def for_stack(cls, run_dir: str) -> "Handle":
        """The handle of a ``launcher up --target swarm`` run folder: RUN_DIR/stack.yml, stack
        sc-swarm-<folder name>."""
        run_dir = os.path.abspath(host_abspath(run_dir))
        name = sanitize_project("sc-swarm-" + os.path.basename(run_dir))
        return cls(os.path.join(run_dir, "stack.yml"), name, run_dir, stack=True)

    @staticmethod
    def check_given(run_dir: str | None, file: str | None, project: str | None) -> None:
        """--run-dir, --file and --project as typed, before any is looked up (None: not given): none empty
        (an empty one never stands for the newest run), not --run-dir with --file, and no --run-dir that is
        a symbolic link to nothing (it loops, or its target is gone: it never becomes a run folder).

        Raises:
            ConfigError: naming the flag, the value and the fix.
        """
        for flag, value, example in (("--run-dir", run_dir, "runs/mesh-2x2x2"), ("--file", file, "docker-compose.yml"),
                                     ("--project", project, "simcluster")):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"{flag}: {value!r} names nothing; leave {flag} out to act on the newest run under "
                                  f"runs/, or name one, e.g. {flag} {example}")
        if run_dir is not None and file is not None:
            raise ConfigError(f"--run-dir {run_dir} and --file {file}: give one (--run-dir: a run folder of `launcher "
                              f"up`, --file: a compose file you started); e.g. --run-dir {run_dir}")
        if run_dir is not None and (loose := unresolved(host_abspath(run_dir))):
            raise ConfigError(f"--run-dir {run_dir}: {loose}; pass the run folder of `launcher up` itself, "
                              f"e.g. --run-dir runs/mesh-2x2x2")

    @classmethod
    def find(cls, run_dir: str | None, file: str | None, project: str | None) -> "Handle":
        """From --run-dir, or --file (+ --project), or else the newest run under ROOT/runs.
        With --file the run folder is read from the containers' labels, once they exist.

        Raises:
            ConfigError: nothing to act on (no such file, no runs yet), or what check_given refuses.
        """
        cls.check_given(run_dir, file, project)
        if file:
            if not os.path.isfile(file):
                raise ConfigError(f"--file {file}: no such compose file"
                                  f"{' (a folder: pass --run-dir for a run folder)' if os.path.isdir(file) else ''}; "
                                  f"e.g. --file docker-compose.yml or --run-dir runs/mesh-2x2x2")
            folder = os.path.dirname(os.path.abspath(file))
            default = os.environ.get("COMPOSE_PROJECT_NAME") or os.path.basename(folder)
            return cls(os.path.abspath(file), project or sanitize_project(default), None)
        if run_dir is None:
            runs = sorted(glob.glob(os.path.join(ROOT, "runs", "*", "compose.yml")), key=os.path.getmtime)
            if not runs:
                raise ConfigError("no run found under runs/; pass --run-dir DIR or --file COMPOSE_FILE")
            run_dir = os.path.dirname(runs[-1])
        if not os.path.isdir(host_abspath(run_dir)):
            what = "a file, not a folder" if os.path.exists(host_abspath(run_dir)) else "no such folder"
            raise ConfigError(f"--run-dir {run_dir}: {what}; pass the run folder of a `python -m launcher up` run "
                              f"(it holds compose.yml), e.g. --run-dir runs/mesh-2x2x2, or --file COMPOSE_FILE")
        compose, stack = cls.for_run(run_dir), cls.for_stack(run_dir)
        if os.path.isfile(stack.file) and (not os.path.isfile(compose.file)
                                           or os.path.getmtime(stack.file) > os.path.getmtime(compose.file)):
            return stack  # the run folder's latest `up` was a swarm stack
        if not os.path.isfile(compose.file):
            raise ConfigError(f"--run-dir {run_dir}: no compose.yml there (not started by `python -m launcher up`?)")
        return compose if project is None else cls(compose.file, project, compose.run_dir)

    def with_labels(self, found: dict) -> "Handle":
        """This handle with the run folder its containers' labels name, when not known yet."""
        for c in found.values():
            label = c.labels.get(LABEL + "run-dir")
            if self.run_dir is None and label:
                return dataclasses.replace(self, run_dir=host_abspath(label))
        return self

