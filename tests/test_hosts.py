"""Several hosts rehearsed here: ``up --target swarm --hosts N`` (launcher/engines/swarm/hosts.py, rehearse.py).

    python -m pytest -q tests/test_hosts.py
    CI=true python -m pytest -q tests/test_hosts.py     # the rehearsal must not skip

The refusals need no engine. One rehearsal of two hosts (each a Docker engine in a container, one
swarm, host-0's registry, the run folder shared) serves the rest: a 2x2x2 job with --traffic and
--inter-host-bandwidth whose losses equal the one-process reference (as the one-engine runs'
do), whose summary names each node's host and the bytes between hosts; status and logs on the
kept hosts; then, on the same hosts, a 2x1x1 job whose host-1 is killed at step 3, which ends
non-zero within 180 s naming the host; afterwards no host, network or stack is left.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import reference_losses

from simcluster.launcher.container.layout import IMAGE  # SIMCLUSTER_IMAGE's, as the launcher's

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parents[0] / "shared" / "data" / "tinyshakespeare.txt"


def launcher(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("args, problem", [
    (["--target", "swarm", "--hosts", "0"], "hosts: must be >= 1"),
    (["--target", "swarm", "--hosts", "3"], "--hosts 3: more hosts than the job's 2 node(s)"),
    (["--target", "compose", "--hosts", "2"], "--hosts 2: rehearsal hosts are a swarm of Docker engines; add --target swarm"),
    (["--target", "slurm", "--hosts", "2"], "add --target swarm"),
    (["--inter-host-bandwidth", "1gbit"], "inter_host_bandwidth: shapes the links between rehearsal hosts, and there are none"),
    (["--target", "swarm", "--hosts", "2", "--inter-host-bandwidth", "fast"], "inter_host_bandwidth: 'fast' is not a tc rate"),
])
def test_hosts_refusals_exit_2_before_anything(tmp_path, args, problem):
    run_dir = tmp_path / "never"
    proc = launcher("up", "--mesh", "2x1x1", "--model", "tiny", "--run-dir", str(run_dir), *args)
    assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
    assert not run_dir.exists()


def test_host_faults_refused_before_anything(tmp_path):
    from simcluster.launcher.drills.faults import DisconnectHost, KillHost, check
    from simcluster.launcher.drills.host_chaos import check_host
    from simcluster.core.errors import ConfigError

    names, hosts = ("node-0", "node-1"), ("host-0", "host-1")
    assert check((KillHost("host-1", at_step=3), DisconnectHost("host-0")), names, 2, hosts) == []
    assert "its hosts are host-0, host-1" in check((KillHost("host-7"),), names, 2, hosts)[0]
    assert "only manager" in check((KillHost("host-0"),), names, 2, hosts)[0]
    assert "add target='swarm', hosts=2" in check((KillHost("host-1"),), names, 2, ())[0]
    with pytest.raises(ConfigError, match="has hosts host-0, host-1; e.g. --kill-host host-1"):
        check_host("kill-host", "host-9", list(hosts), "runs/x")
    (tmp_path / "file.txt").write_text("x")
    proc = launcher("chaos", "--kill-host", "host-1", "--run-dir", str(tmp_path / "file.txt"))
    assert proc.returncode == 2 and "a file, not a folder" in proc.stderr, proc.stderr


def test_an_engine_without_the_privileges_is_named(monkeypatch, tmp_path):
    """A host container the engine refuses to start (here: runc's 'unable to apply caps') is one ConfigError naming
    what a host needs; nothing is left (start_host made nothing)."""
    import docker
    from simcluster.launcher.docker import hosts as docker_hosts
    from simcluster.core.errors import ConfigError

    class Refusing:
        class containers:
            @staticmethod
            def run(*args, **kwargs):
                raise docker.errors.APIError("500", explanation="OCI runtime create failed: unable to apply caps: "
                                                                "operation not permitted")
    monkeypatch.setattr(docker_hosts, "_here", lambda: Refusing)
    with pytest.raises(ConfigError, match=r"cannot run an engine in a container: .*operation not permitted.*every "
                                          r"capability but SYS_RESOURCE.*/sys/fs/cgroup"):
        docker_hosts.start_host("host-0", str(tmp_path), [], registry=True)
    (tmp_path / "compose.yml").write_text("services: {}\n")
    proc = launcher("chaos", "--kill-host", "host-1", "--run-dir", str(tmp_path))
    assert proc.returncode == 2 and "is a Compose run, which has no hosts" in proc.stderr, proc.stderr


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.docker
def test_two_hosts_rehearsed(trainer_image, tmp_path):
    import docker

    outer = docker.from_env()
    run_a, run_b = tmp_path / "hosts-2x2x2", tmp_path / "hosts-kill"
    t0 = time.monotonic()
    a = launcher("up", "--target", "swarm", "--hosts", "2", "--mesh", "2x2x2", "--model", "tiny", "--steps", "3",
                 "--data", str(DATA), "--traffic", "1", "--inter-host-bandwidth", "1gbit", "--run-dir", str(run_a),
                 "--mount-code", "--keep", timeout=900)
    wall_a = time.monotonic() - t0
    try:
        out = a.stdout
        assert a.returncode == 0, out[-4000:] + a.stderr[-3000:]
        for line in ("node-0       ranks 0-3      exit 0 on host-0", "node-1       ranks 4-7      exit 0 on host-1",
                     "rendezvous                  exit 0 on host-0", "host-1's link to the other hosts limited to 1gbit",
                     f"host-0:5000/{IMAGE}: pushed to host-0's registry"):
            assert line in out, out[-4000:]
        got, ref = [r["loss"] for r in _rows(run_a)], reference_losses("2x2x2", 3, DATA)
        assert len(got) == 3 and max(abs(x - y) for x, y in zip(got, ref)) < 1e-4, (got, ref)
        summary = json.loads((run_a / "summary.json").read_text())
        assert summary["hosts"] == {"rendezvous": "host-0", "node-0": "host-0", "node-1": "host-1"}
        pipeline = _rows(run_a)[-1]["traffic"]["links"]  # 2 stages: the p2p bytes node 0 <-> node 1
        assert summary["host_traffic"] == {"host-0->host-1": pipeline["0->1"], "host-1->host-0": pipeline["1->0"]}
        assert pipeline["0->1"] > 0 and "; inter-host " in out and "(host-0->host-1 " in out
        assert json.loads((run_a / "job.json").read_text())["hosts"] == {"node-0": "host-0", "node-1": "host-1"}
        assert summary["inter_host_bandwidth"] == "1gbit" and summary["image"].startswith("host-0:5000/")
        stack = yaml.safe_load((run_a / "stack.yml").read_text())["services"]
        assert stack["node-1"]["deploy"]["placement"]["constraints"] == ["node.hostname == host-1"]
        kept = launcher("status", "--run-dir", str(run_a))  # the hosts and the stack are kept (--keep)
        assert kept.returncode == 0 and "host-1" in kept.stdout and "Complete" in kept.stdout, kept.stdout + kept.stderr
        logs = launcher("logs", "--run-dir", str(run_a), "node-1", "--tail", "5")
        assert logs.returncode == 0 and "node-1 | [node-1] torchrun exited 0" in logs.stdout, logs.stdout + logs.stderr

        chaos: dict = {}

        def kill() -> None:  # once `up` made the run folder (chaos refuses a missing one at once)
            deadline = time.monotonic() + 300
            while not run_b.is_dir() and time.monotonic() < deadline:
                time.sleep(0.2)
            chaos["proc"] = launcher("chaos", "--kill-host", "host-1", "--at-step", "3", "--run-dir", str(run_b),
                                     "--wait-s", "300", timeout=400)
        thread = threading.Thread(target=kill)
        thread.start()
        b = launcher("up", "--target", "swarm", "--hosts", "2", "--mesh", "2x1x1", "--model", "tiny", "--steps", "200",
                     "--timeout-s", "20", "--data", str(DATA), "--run-dir", str(run_b), "--mount-code", timeout=600)
        ended = time.time()
        thread.join()
        out = b.stdout
        assert "reusing hosts host-0, host-1" in out and b.returncode == 1, out[-4000:] + b.stderr[-3000:]
        said = chaos["proc"].stdout
        assert chaos["proc"].returncode == 0 and "chaos: kill-host host-1 (container simcluster-host-1) at step" in said
        killed_at = float(said.rsplit("t=", 1)[1].split()[0])
        assert ended - killed_at < 180, (ended - killed_at, out[-3000:])
        assert "LOST HOST    host-1: its engine stopped answering; node-1 went with it" in out, out[-3000:]
        assert "node-1       ranks 1        exit None on host-1 (lost with host-1)" in out, out[-3000:]
        assert json.loads((run_b / "summary.json").read_text())["lost_hosts"] == {"host-1": ["node-1"]}
        assert "hosts host-0, host-1 removed" in out
    finally:
        launcher("down", "--run-dir", str(run_a))  # only if a step above failed: B's `up` removes the hosts
    left = outer.containers.list(all=True, filters={"label": "io.simcluster.hosts"})
    assert not left and not outer.networks.list(names=["simcluster-hosts"]), left
    print(f"hosts: 2x2x2 up {wall_a:.1f}s (hosts, push, pull, run); the kill run ended {ended - killed_at:.1f}s "
          f"after the kill", file=sys.stderr)
