"""Faults of a rehearsal host (``up --target swarm --hosts N``): ``python -m launcher chaos --kill-host``.

    python -m launcher chaos --kill-host host-1 --at-step 3 --run-dir runs/hosts-2x1x1
    python -m launcher chaos --disconnect-host host-1 --at-step 3 --run-dir runs/hosts-2x1x1

Waits until the run's hosts are up (RUN_DIR/hosts.json and their containers, written by ``up``) and
the run reaches step N (the last row of RUN_DIR/metrics.jsonl, or rank 0's step records, written
since the hosts started), then:
    --kill-host        ``docker kill`` the host's engine container: every node on it is lost at once,
                       as when a machine loses power
    --disconnect-host  ``docker network disconnect`` it from the hosts' network: its links to every
                       other host, and to the launcher, are cut
The run then ends non-zero naming the host (``up`` pings each host's engine, observe/follow.py) and
the nodes that went with it. host-0 holds the swarm's manager and the registry: it is not killed
(a real swarm with one manager cannot lose it either; docs/engines.md). Exit 0 once the fault is
applied; 1 if the run ended, or --wait-s ran out, first.
"""
from __future__ import annotations

import glob
import os
import time

from simcluster.launcher.docker.handle import Handle
from simcluster.launcher.docker.hosts import HOSTS_FILE, cut, host_containers, kill_host
from simcluster.launcher.drills.chaos_checks import check_step, check_wait
from simcluster.launcher.job.files import ROOT, host_abspath
from simcluster.core.errors import ConfigError
from simcluster.core.rundir import last_step

HOST_FAULTS = ("kill-host", "disconnect-host")
START_WAIT_S = 300.0  # how long it waits for `up` to bring the hosts up (a first push of the image included)


def _run_dir(run_dir: str | None, starting: bool) -> str:
    if run_dir is not None:
        if os.path.exists(host_abspath(run_dir)) and not os.path.isdir(host_abspath(run_dir)):
            raise ConfigError(f"--run-dir {run_dir}: a file, not a folder; pass the run folder of `launcher up "
                              f"--target swarm --hosts N`, e.g. --run-dir runs/mesh-2x1x1")
        if not starting and not os.path.isdir(host_abspath(run_dir)):
            raise ConfigError(f"--run-dir {run_dir}: no such folder; start the run first (python -m launcher up "
                              f"--target swarm --hosts 2 --run-dir {run_dir} ...), then run chaos while it runs")
        return host_abspath(run_dir)
    found = sorted(glob.glob(os.path.join(ROOT, "runs", "*", HOSTS_FILE)), key=os.path.getmtime)
    if not found:
        raise ConfigError("chaos: no run with rehearsal hosts under runs/; pass --run-dir of a `launcher up --target "
                          "swarm --hosts N` run")
    return os.path.dirname(found[-1])


def check_host(kind: str, host: str, names: list[str], where: str) -> None:
    """Raises ConfigError: host is not one of names (listing them), or kill-host of host-0 (the manager)."""
    if host not in names:
        raise ConfigError(f"{kind}: --{kind} {host}: the run in {where} has hosts {', '.join(names)}; e.g. "
                          f"--{kind} {names[-1]}")
    if kind == "kill-host" and host == names[0]:
        raise ConfigError(f"kill-host: --kill-host {host}: {host} is the swarm's only manager and the registry (a "
                          f"swarm that loses its only manager cannot go on); kill a worker, e.g. --kill-host "
                          f"{names[-1]}" + (f", or cut it off: --disconnect-host {host}" if len(names) > 1 else ""))


def rehearsal(engines, folder: str):
    """The record of folder's rehearsal hosts, from the engine among engines that ran it on hosts (Engine.hosts),
    or None (none yet, or a run on one daemon)."""
    return next((reh for engine in engines if (reh := engine.hosts(folder)) is not None), None)


def chaos_host(kind: str, host: str, at_step: int, run_dir: str | None = None, wait_s: float = 3600.0,
               poll_s: float = 0.5, say=None, starting: bool = False, *, engines) -> int:
    """Wait for step at_step of the run on rehearsal hosts, then apply kind to host; the exit code.

    say: where its lines go, ``say(text, error)`` (default: printed). starting: the run is being started
    beside it (simcluster.run's faults), so its folder may not exist yet; else a missing one is refused.
    engines: the engines whose runs it may act on (the table's, or the one running the job), asked for
    the run's hosts (Engine.hosts).

    Raises:
        ConfigError: an unknown kind or host, a step below 1 or after the run's last (its job.json), a
            --wait-s out of range (chaos_checks.check_wait), a run folder that is a file, missing, a Compose run's or
            none with hosts, a hosts record that is not one.
    """
    say = say or (lambda text, error=False: print(text, flush=True))
    if kind not in HOST_FAULTS:
        raise ConfigError(f"chaos: unknown host fault {kind!r}; choose one of {', '.join(HOST_FAULTS)}")
    check_wait(at_step, wait_s)
    Handle.check_given(run_dir, None, None)
    folder = _run_dir(run_dir, starting)
    check_step(at_step, folder if os.path.isdir(folder) else None, f"--{kind} {host}")
    if (early := rehearsal(engines, folder)) is not None:
        check_host(kind, host, early.names, folder)
    elif os.path.isfile(os.path.join(folder, "compose.yml")):
        raise ConfigError(f"{kind}: {folder} is a Compose run, which has no hosts; use --kill NODE there, or run the "
                          f"job with --target swarm --hosts 2")
    t0 = time.monotonic()
    say(f"chaos: waiting for step {at_step} of {folder} to {kind} {host}", False)
    checked = since = None
    while True:
        found = host_containers()
        reh = rehearsal(engines, folder)
        if found and reh is not None:
            if not checked:
                check_host(kind, host, reh.names, folder)
                checked = True
            since = since or os.path.getmtime(reh.record)  # written as the run starts
            step = last_step(folder, since)
            if step is not None and step >= at_step:
                victim = found[host]
                if kind == "kill-host":
                    kill_host(victim)
                else:
                    cut(victim)
                say(f"chaos: {kind} {host} (container {victim.name}) at step {step} t={time.time():.3f}", False)
                return 0
        elif since is not None:
            say(f"chaos: the hosts of {folder} are gone before step {at_step} (the run ended); nothing done", True)
            return 1
        waited = time.monotonic() - t0
        if waited > wait_s or (since is None and waited > min(wait_s, START_WAIT_S)):
            say(f"chaos: step {at_step} of {folder} not reached within {waited:.0f}s; nothing done", True)
            return 1
        time.sleep(poll_s)
