"""Engine targets run for real on Docker: the Slurm simulation with parity, and the container
command of each Kubernetes manifest in containers named as the cluster's DNS would name them.

    CI=true OMP_NUM_THREADS=1 python -m pytest -q tests/test_engines_docker.py

The Kubernetes test gives each container exactly what that engine injects: the JobSet's job
index (downward API -> NODE_RANK, SIMCLUSTER_NODE), or the torch runtime's PET_* variables for
the TrainJob, and expands ``$(VAR)`` in the command as the kubelet does.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import reference_losses

from simcluster.launcher.job.files import code_mounts

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parents[0] / "shared" / "data" / "tinyshakespeare.txt"
pytestmark = pytest.mark.docker


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_slurm_up_2x2x2_parity(trainer_image, tmp_path):
    run_dir = tmp_path / "slurm-2x2x2"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--target", "slurm", "--mesh", "2x2x2", "--model",
                           "tiny", "--steps", "3", "--data", str(DATA), "--run-dir", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "COMPLETED (exit 0:0) on 2 nodes; output" in proc.stdout  # then the shared summary (observe/summary.py)
    assert "== summary: OK ==" in proc.stdout and " after 3 steps" in proc.stdout
    assert "host=node-1 coords=pp1/dp0/tp0" in proc.stdout  # SLURM_NODEID 1 holds stage 1
    got, ref = _losses(run_dir), reference_losses("2x2x2", 3, DATA)
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, ref)) < 1e-4, (got, ref)
    script = (run_dir / "job.sbatch").read_text()
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=mesh-2x2x2\n#SBATCH --nodes=2\n")
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=io.simcluster.slurm=sc-slurm-slurm-2x2x2"],
                          capture_output=True, text=True).stdout
    assert left == "", "containers left behind"
    print(f"slurm up: {time.monotonic() - t0:.1f}s", file=sys.stderr)


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command and args ($$ is a literal $)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def _pods(target: str, doc: dict) -> tuple[str, list[tuple[str, list[str], dict[str, str]]]]:
    """(subdomain, [(pod host name, command, env)]) as the engine would start them."""
    name = doc["metadata"]["name"]
    if target == "jobset":
        rj = doc["spec"]["replicatedJobs"][0]
        c = rj["template"]["spec"]["template"]["spec"]["containers"][0]
        pods = []
        for k in range(rj["replicas"]):
            env = {e["name"]: e["value"] if "value" in e else str(k) for e in c["env"]}  # job-index fields -> k
            pods.append((f"{name}-{rj['name']}-{k}-0", [_expand(a, env) for a in c["command"]], env))
        return name, pods
    tr = doc["spec"]["trainer"]
    pods = []
    for k in range(tr["numNodes"]):
        env = {e["name"]: e["value"] for e in tr["env"]}
        env.update(PET_NNODES=str(tr["numNodes"]), PET_NPROC_PER_NODE=str(tr["numProcPerNode"]),
                   PET_NODE_RANK=str(k), PET_MASTER_ADDR=f"{name}-node-0-0.{name}", PET_MASTER_PORT="29400")
        pods.append((f"{name}-node-{k}-0", [_expand(a, env) for a in tr["command"]], env))
    return name, pods


@pytest.mark.parametrize("target", ["jobset", "trainjob"])
def test_k8s_command_runs(trainer_image, tmp_path, target):
    import docker

    text = subprocess.run([sys.executable, "-m", "launcher", "generate", "--target", target, "--mesh", "2x1x1",
                           "--model", "tiny", "--steps", "2", "--image", "registry.example.com/simcluster/trainer:latest",
                           "--stdout"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    subdomain, pods = _pods(target, yaml.safe_load(text))
    runs = tmp_path / "runs"
    (runs / "mesh-2x1x1").mkdir(parents=True)
    for p in (runs, runs / "mesh-2x1x1"):
        os.chown(p, 1000, 1000) if os.getuid() == 0 else None
    dc = docker.from_env()
    tag = f"sc-k8s-{target}-{os.getpid()}"
    net = dc.networks.create(tag, driver="bridge", internal=True)
    made = []
    try:
        for host, cmd, env in pods:
            c = dc.containers.create(trainer_image, cmd, name=f"{tag}-{host.rsplit('-', 2)[-2]}", hostname=host,
                                     environment=env, user="1000:1000", read_only=True, cap_drop=["ALL"],
                                     tmpfs={"/tmp": ""}, network=tag,
                                     volumes={str(runs): {"bind": "/runs", "mode": "rw"},
                                              **{src: {"bind": dst, "mode": "ro"} for src, dst in code_mounts()}})
            net.disconnect(c)  # only the cluster network (eth0), reached by the pod's DNS names
            net.connect(c, aliases=[host, f"{host}.{subdomain}"])
            made.append(c)
        for c in made:
            c.start()
        codes = [c.wait(timeout=600)["StatusCode"] for c in made]
        logs = "\n".join(c.logs().decode(errors="replace") for c in made)
        assert codes == [0, 0], logs[-4000:]
        assert "host=" + pods[1][0] + " coords=pp1/dp0/tp0" in logs, logs[-4000:]  # node rank 1 holds stage 1
        # Stock torchrun's agents may race at their exit barrier (pytorch/pytorch#69520: node 0's agent,
        # which serves the store, exits while node 1's last store call is in flight); that agent logs a
        # traceback and still exits 0. Any other traceback is a failure of ours.
        tracebacks = logs.count("Traceback (most recent call last)")
        assert tracebacks == logs.count("Error waiting on exit barrier"), logs[-4000:]
        assert len(_losses(runs / "mesh-2x1x1")) == 2
    finally:
        for c in made:
            c.remove(force=True)
        net.remove()


def test_two_docker_clients_side_by_side():
    """No process-wide Docker switch: a Client of rehearsal hosts (here one whose daemon is gone) and this
    machine's Client answer side by side, each for its own daemons."""
    from simcluster.launcher.docker import client as client_module
    from simcluster.launcher.docker.client import Client

    gone, here = Client((("host-0", "tcp://127.0.0.1:9"),)), Client()
    assert gone.silent_hosts() == ["host-0"] and gone.sdks() == [] and gone.containers("sc-nothing") == {}
    assert gone.cli_env()["DOCKER_HOST"] == "tcp://127.0.0.1:9" and here.cli_env() is None
    assert here.silent_hosts() == [] and [name for name, _ in here.sdks()] == [""]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", here.info()["ServerVersion"])  # this machine's daemon, unaffected
    assert not hasattr(client_module, "HOSTS") and not hasattr(client_module, "use_hosts")
