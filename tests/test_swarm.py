"""Docker Swarm: the stack generator (pure), the refusals of `up --target swarm`, and one real run.

    python -m pytest -q tests/test_swarm.py
    CI=true OMP_NUM_THREADS=1 python -m pytest -q tests/test_swarm.py    # the run must not skip

The run: ``launcher up --target swarm`` of examples/ddp.py with the instruments (this checkout's
code mounted) on a one-node swarm the launcher makes when the engine is in none, and leaves
again; its summary and exit code are checked, and afterwards no stack, container or network of
it is left and the swarm state (and docker_gwbridge) is as found. A 2x2x2 job's losses against
the one-process reference on a swarm: tests/test_hosts.py (two hosts). Golden files of the
stack: tests/test_targets.py.
"""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import need
from simcluster.launcher.job.entry import resolve_training
from simcluster.launcher.job.launch import NodeOptions
from simcluster.launcher.engines.swarm import render as swarm
from simcluster.core.config import Config
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parents[0] / "shared" / "data" / "tinyshakespeare.txt"
REGISTRY_IMAGE = "registry.example.com/simcluster/trainer:latest"
NO_ENGINE = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
ENGINE_EXCLUSIVE = True  # conftest._engine_share: the swarm's leave stops other networks' DNS, so nothing runs beside it


def launcher(*args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_stack_fields_map_to_swarm():
    launch = resolve_training(Config(mesh="4x1x2", model="tiny"),
                              NodeOptions(image=REGISTRY_IMAGE, cpus_per_node=1.5, memory_per_node="3G"))
    doc = swarm.build(launch, "/shared/sc")
    assert doc["version"] == "3.8"
    assert doc["networks"] == {"cluster": {"driver": "overlay", "internal": True, "attachable": True}}
    assert list(doc["services"]) == ["rendezvous", "node-0", "node-1", "node-2", "node-3"]
    for name, svc in doc["services"].items():
        assert svc["hostname"] == name and svc["networks"] == ["cluster"] and svc["image"] == REGISTRY_IMAGE
        assert not {"security_opt", "depends_on", "pull_policy", "restart", "cpus", "mem_limit", "tmpfs", "ports"} & set(svc)
        assert (svc["cap_drop"], svc["read_only"], svc["user"]) == (["ALL"], True, "1000:1000")
        assert {"type": "tmpfs", "target": "/tmp"} in svc["volumes"]
        deploy = svc["deploy"]
        assert deploy["endpoint_mode"] == "dnsrr" and deploy["restart_policy"] == {"condition": "none"}
        assert deploy.get("resources") == (None if name == "rendezvous" else {"limits": {"cpus": "1.5", "memory": "3g"}})
    node2 = doc["services"]["node-2"]
    assert node2["command"][node2["command"].index("--node-rank") + 1] == "2"
    assert node2["labels"]["io.simcluster.ranks"] == "4-5" and node2["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert node2["volumes"][0] == "/shared/sc/runs/mesh-4x1x2:/runs/mesh-4x1x2:rw"
    many = swarm.build(resolve_training(Config(mesh="12x1x1", model="tiny", n_layers=12, global_batch=12), NodeOptions()), "..")
    hosts = [s["hostname"] for n, s in many["services"].items() if n != "rendezvous"]
    assert hosts[:3] == ["node-00", "node-01", "node-02"] and sorted(hosts) == hosts  # c10d's order = node rank
    assert swarm.stack_name(launch) == "sc-swarm-mesh-4x1x2"
    cuda = swarm.build(resolve_training(Config(mesh="2x2x2", model="tiny", device="cuda"), NodeOptions()), "..")
    assert cuda["services"]["node-1"]["deploy"]["resources"] == {"reservations": {"generic_resources": [
        {"discrete_resource_spec": {"kind": "NVIDIA-GPU", "value": 4}}]}}
    assert "resources" not in cuda["services"]["rendezvous"]["deploy"]


def test_generate_workdir_local_image_and_bad_workdir(tmp_path):
    proc = launcher("generate", "--target", "swarm", "--mesh", "2x2x2", "--model", "tiny", "--workdir", "/shared/me/sc",
                    "--stdout")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    assert doc["services"]["node-1"]["volumes"][0] == "/shared/me/sc/runs/mesh-2x2x2:/runs/mesh-2x2x2:rw"
    assert "warning: --image simcluster/trainer:latest names no registry: fine on a one-node swarm" in proc.stderr
    assert "docker save simcluster/trainer:latest | ssh HOST docker load" in proc.stderr
    out = tmp_path / "s.yml"
    bad = launcher("generate", "--target", "swarm", "--mesh", "2x2x2", "--workdir", "shared/sc", "--out", str(out))
    assert bad.returncode == 2 and "swarm bind mounts need an absolute host path" in bad.stderr and not out.exists()


@pytest.mark.docker
def test_stack_file_passes_the_v3_schema(docker_available, tmp_path):
    """Compose v1 validates a version 3.8 file against the schema docker stack deploy uses (unknown keys fail)."""
    out = tmp_path / "stack.yml"
    proc = launcher("generate", "--target", "swarm", "--mesh", "2x2x2", "--model", "tiny", "--device", "cuda",
                    "--cpus-per-node", "2", "--memory-per-node", "3g", "--image", REGISTRY_IMAGE, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run(["docker-compose", "-f", str(out), "config", "-q"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("info,image,problem", [
    (None, REGISTRY_IMAGE, "this engine has no swarm mode"),
    ({"LocalNodeState": "pending", "Error": ""}, REGISTRY_IMAGE, "swarm state is 'pending'"),
    ({"LocalNodeState": "active", "ControlAvailable": False}, REGISTRY_IMAGE, "this engine is a swarm worker"),
    ({"LocalNodeState": "active", "ControlAvailable": True, "Nodes": 3}, "simcluster/trainer:latest",
     "this swarm has 3 nodes, so tasks may run on other hosts, which cannot see a locally built image"),
    ({"LocalNodeState": "active", "ControlAvailable": True, "Nodes": 3}, REGISTRY_IMAGE, None),
    ({"LocalNodeState": "active", "ControlAvailable": True, "Nodes": 1}, "simcluster/trainer:latest", None),
    ({"LocalNodeState": "inactive"}, "simcluster/trainer:latest", None),
])
def test_swarm_checks(monkeypatch, info, image, problem):
    from simcluster.launcher.docker import cluster
    from simcluster.launcher.docker.client import Client
    from simcluster.launcher.engines.swarm import run as swarm_run

    # a daemon answering docker info with this Swarm section, and no stack up
    monkeypatch.setattr(Client, "info", lambda self: {} if info is None else {"Swarm": info})
    monkeypatch.setattr(cluster, "stack_tasks", lambda client, stack: {})
    launch = resolve_training(Config(mesh="2x2x2", model="tiny"), NodeOptions(image=image))
    if problem is None:
        swarm_run.check_engine(Client(), launch, "sc-swarm-x")
    else:
        with pytest.raises(ConfigError, match=problem):
            swarm_run.check_engine(Client(), launch, "sc-swarm-x")


@pytest.mark.parametrize("extra,problem", [
    ([], "--target swarm: no Docker engine answers"),
    (["--max-restarts", "1", "--keep"], "--max-restarts: the stack runs with restart_policy none"),
])
def test_up_refusals_exit_2_before_anything(tmp_path, extra, problem):
    run_dir = tmp_path / "run"
    proc = launcher("up", "--target", "swarm", "--mesh", "2x2x2", "--model", "tiny", "--run-dir", str(run_dir),
                    *extra, env=NO_ENGINE)
    assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
    assert not run_dir.exists()
    if extra:
        assert "--keep: the stack is always removed" in proc.stderr


def test_compose_commands_on_a_swarm_run_exit_2(tmp_path):
    run_dir = tmp_path / "sw"
    run_dir.mkdir()
    (run_dir / "stack.yml").write_text("version: '3.8'\n")
    proc = launcher("status", "--run-dir", str(run_dir), env=NO_ENGINE)
    assert proc.returncode == 2 and "docker stack ps sc-swarm-sw" in proc.stderr, proc.stderr


def _swarm_problem() -> str | None:
    import docker

    sw = docker.from_env().info().get("Swarm") or {}
    state = sw.get("LocalNodeState")
    if state == "inactive" or (state == "active" and sw.get("ControlAvailable")):
        return None
    return f"this Docker engine cannot deploy a stack (swarm state {state!r}, manager {sw.get('ControlAvailable')})"


def _engine_state() -> tuple:
    """The swarm state and the networks a swarm brings (other tests may add bridge networks meanwhile)."""
    import docker

    dc = docker.from_env()
    names = {n.name for n in dc.networks.list()}
    return dc.info()["Swarm"]["LocalNodeState"], "docker_gwbridge" in names, "ingress" in names


def test_swarm_up_your_code_with_its_instruments(trainer_image, tmp_path):
    """examples/ddp.py on a swarm stack with --traffic 1 --trace-steps 2: the stack file carries the
    instruments, the node wrapper loads them in the ranks, up merges the trace. The script writes
    its metrics.jsonl elsewhere, so progress and the steps row come from the instruments alone (the loss
    from what rank 0 printed),
    the ETA from --total-steps (about 20 s)."""
    import docker

    need(_swarm_problem())
    before = _engine_state()
    run_dir = tmp_path / "swarm-ddp"
    proc = launcher("up", "--target", "swarm", "--nodes", "2", "--nproc-per-node", "1", "--traffic", "1",
                    "--trace-steps", "2", "--total-steps", "3", "--script", str(ROOT / "examples" / "ddp.py"),
                    "--run-dir", str(run_dir), "--mount-code", "--", "--steps", "3", "--out-dir", "/tmp/own",
                    env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    assert not (run_dir / "metrics.jsonl").exists()
    assert re.search(r"^launcher\s*\| progress: step 3/3 \(100%\)", out, re.M), out[-3000:]
    # no metrics.jsonl: the loss is the one rank 0 printed (`step 3/3 loss X`), read by the default pattern
    assert re.search(r"  final loss +\d+\.\d+ after 3 steps \(as rank 0 printed it\)", out), out[-3000:]
    for rank in (0, 1):
        steps = [json.loads(x)["step"] for x in (run_dir / "steps" / f"rank-{rank}.jsonl").read_text().splitlines()]
        traffic = [json.loads(x) for x in (run_dir / "traffic" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3] and [t["step"] for t in traffic] == [1, 2, 3]
        assert traffic[1]["links"] == {"span": sum(traffic[1]["bytes"].values())}  # the two nodes' all-reduces
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    assert {e["tid"] for e in trace if e.get("ph") == "X" and e["tid"] < 1000} == {0, 1}
    assert "traffic/step world_all_reduce" in out and f"trace        {run_dir}/trace.json" in out
    stack = "sc-swarm-swarm-ddp"
    assert f"launcher: stack {stack} removed" in out
    assert yaml.safe_load((run_dir / "stack.yml").read_text())["services"]["node-0"]["volumes"][0] == \
        f"{run_dir}:/runs/swarm-ddp:rw"  # absolute on `up`
    label = {"label": f"com.docker.stack.namespace={stack}"}
    dc = docker.from_env()
    assert not dc.containers.list(all=True, filters=label) and not dc.networks.list(filters=label)
    assert _engine_state() == before, "the swarm state, docker_gwbridge or ingress changed"
