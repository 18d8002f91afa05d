"""Thin wrappers over the docker and compose command lines (v2 ``docker compose`` or v1
``docker-compose``), and the Target a command acts on (compose file + project + run folder).

    python -c "from launcher.dockercli import compose_cli; print(compose_cli())"
    SIMCLUSTER_COMPOSE=docker-compose python -m launcher status    # force compose v1

Containers are found by the labels both compose versions set
(com.docker.compose.project / .service), so the rest of the launcher is version-agnostic.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

import yaml

from train.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root


class LauncherError(RuntimeError):
    """Docker/compose failed or is missing; the message says what to do (exit code 1)."""


@functools.lru_cache(maxsize=None)
def compose_cli() -> tuple[str, ...]:
    """The compose command: $SIMCLUSTER_COMPOSE, else ``docker compose`` (v2) if it answers,
    else ``docker-compose`` (v1).

    Raises:
        LauncherError: neither is installed.
    """
    if os.environ.get("SIMCLUSTER_COMPOSE"):
        return tuple(shlex.split(os.environ["SIMCLUSTER_COMPOSE"]))
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    raise LauncherError("no compose found: install the Docker Compose v2 plugin (`docker compose`) or docker-compose v1")


def compose(project: str, file: str, *args: str, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run ``<compose> -p PROJECT -f FILE ARGS...`` (output goes to the terminal unless captured)."""
    cmd = [*compose_cli(), "-p", project, "-f", file, *args]
    proc = subprocess.run(cmd, **kwargs)
    if check and proc.returncode != 0:
        raise LauncherError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}")
    return proc


def sanitize_project(name: str) -> str:
    """A compose project name both versions accept: lowercase [a-z0-9_-], starting alphanumeric."""
    name = re.sub(r"[^a-z0-9_-]", "", name.lower()).lstrip("-_")
    return name or "simcluster"


def containers(project: str) -> dict[str, dict]:
    """service -> {"id", "state", "status"} of the project's containers (all, running or not)."""
    fmt = '{{.ID}}\t{{.Label "com.docker.compose.service"}}\t{{.State}}\t{{.Status}}'
    proc = subprocess.run(["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
                           "--format", fmt], capture_output=True, text=True)
    if proc.returncode != 0:
        raise LauncherError(f"docker ps failed: {proc.stderr.strip()}")
    out = {}
    for line in proc.stdout.splitlines():
        cid, service, state, status = (line.split("\t") + ["", "", "", ""])[:4]
        out[service] = {"id": cid, "state": state, "status": status}
    return out


def exit_codes(ids: dict[str, str]) -> dict[str, int | None]:
    """service -> exit code of its (stopped) container; None if it cannot be read."""
    codes: dict[str, int | None] = {}
    for service, cid in ids.items():
        proc = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", cid], capture_output=True, text=True)
        codes[service] = int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None
    return codes


def image_exists(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


def nodes_from_doc(doc: dict) -> list[tuple[str, str]]:
    """(node service, "first-last" ranks) of a generated compose document, in node order."""
    out = []
    for name, svc in (doc.get("services") or {}).items():
        cmd = [str(c) for c in svc.get("command") or []]
        if "launcher.node" not in cmd:
            continue
        k, n = int(cmd[cmd.index("--node-rank") + 1]), int(cmd[cmd.index("--nproc-per-node") + 1])
        out.append((name, f"{k * n}-{k * n + n - 1}" if n > 1 else str(k * n)))
    return out


@dataclass(frozen=True)
class Target:
    """What down/status/logs act on: a compose file, its project name, its host run folder."""

    file: str
    project: str
    run_dir: str | None

    @classmethod
    def for_run(cls, run_dir: str) -> "Target":
        """The target of an ``up`` run folder (compose file RUN_DIR/compose.yml)."""
        run_dir = os.path.abspath(run_dir)
        return cls(os.path.join(run_dir, "compose.yml"), sanitize_project("sc-" + os.path.basename(run_dir)), run_dir)

    @classmethod
    def find(cls, run_dir: str | None, file: str | None, project: str | None) -> "Target":
        """From --run-dir, or --file (+ --project), or else the newest run under ROOT/runs.

        Raises:
            ConfigError: nothing to act on (no such file, no runs yet).
        """
        if file:
            if not os.path.isfile(file):
                raise ConfigError(f"--file {file}: no such compose file")
            with open(file, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh) or {}
            folder = os.path.dirname(os.path.abspath(file))
            default = os.environ.get("COMPOSE_PROJECT_NAME") or os.path.basename(folder)
            return cls(os.path.abspath(file), project or sanitize_project(default), _run_dir_of(doc, folder))
        if run_dir is None:
            runs = sorted(glob.glob(os.path.join(ROOT, "runs", "*", "compose.yml")), key=os.path.getmtime)
            if not runs:
                raise ConfigError("no run found under runs/; pass --run-dir DIR or --file COMPOSE_FILE")
            run_dir = os.path.dirname(runs[-1])
        target = cls.for_run(run_dir)
        if not os.path.isfile(target.file):
            raise ConfigError(f"--run-dir {run_dir}: no compose.yml there (not started by `python -m launcher up`?)")
        return target if project is None else cls(target.file, project, target.run_dir)

    def doc(self) -> dict:
        with open(self.file, encoding="utf-8") as fh:
            return yaml.safe_load(fh) or {}


def _run_dir_of(doc: dict, folder: str) -> str | None:
    """Host run folder of a compose document: the source of the ``:/runs/..`` mount."""
    for svc in (doc.get("services") or {}).values():
        for vol in svc.get("volumes") or []:
            parts = str(vol).split(":")
            if len(parts) >= 2 and parts[1].startswith("/runs/"):
                return os.path.normpath(os.path.join(folder, parts[0]))
    return None
