"""The hardware a plan names: a target of hardware.py's table, or ``local``, this machine measured by
calibrate.py once and cached in a file.

    python -c "from simcluster.train.plan.lookup import hardware; print(hardware('h100-sxm-8x').name)"
    python -m launcher plan --mesh 2x2x2 --model small --hardware local [--recalibrate]

Above both hardware.py (the models) and calibrate.py (the measurement), so neither imports the other
back.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from dataclasses import asdict

from simcluster.core.errors import ConfigError
from simcluster.train.plan.calibrate import calibrate
from simcluster.core.hardware import HARDWARE, NAMES, Hardware

CACHE_VERSION = 4  # bumped whenever Hardware's fields or the calibration's method change


def cache_path() -> str:
    """The calibration file: $SIMCLUSTER_CACHE (else $XDG_CACHE_HOME/simcluster, ~/.cache/simcluster)/
    hardware-local-v{CACHE_VERSION}.json (another version's file is left alone, never read)."""
    base = os.environ.get("SIMCLUSTER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "simcluster")
    return os.path.join(base, f"hardware-local-v{CACHE_VERSION}.json")


def _cached(path: str) -> Hardware | None:
    """The Hardware of a calibration file, or None when it is missing, unreadable or not this version's."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(Hardware)}:
            return None
        return Hardware(**{**data, "sources": tuple(data["sources"]), "capability": tuple(data["capability"]),
                           "collective_cpu": tuple(tuple(row) for row in data["collective_cpu"])})
    except (OSError, ValueError, TypeError):
        return None


def local(recalibrate: bool = False) -> Hardware:
    """This machine: the cached calibration, or a fresh one (calibrate.py, under a minute) written to
    cache_path() (also when the file there is unreadable or of another shape). Processes that ask at
    once calibrate once: the others wait on cache_path() + ".lock" and read what it wrote."""
    path = cache_path()
    hw = None if recalibrate else _cached(path)
    if hw is not None:
        return hw
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one calibration at a time: a second would measure the first's load
        hw = None if recalibrate else _cached(path)  # another process calibrated while this one waited
        if hw is not None:
            return hw
        hw = calibrate()
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(asdict(hw), fh, indent=1)
        os.replace(path + ".tmp", path)
    return hw


def hardware(name: str, recalibrate: bool = False) -> Hardware:
    """The model named; "local" calibrates on first use.

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    if name == "local":
        return local(recalibrate)
    if name not in HARDWARE:
        raise ConfigError(f"hardware: unknown {name!r}; choose one of {', '.join(NAMES)}")
    return HARDWARE[name]
