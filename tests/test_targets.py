"""Engine targets without Docker: golden files, Kubernetes validation offline, GPU fields, bad input.

    python -m pytest -q tests/test_targets.py
    UPDATE_GOLDEN=1 python -m pytest -q tests/test_targets.py   # rewrite tests/golden/<target>-mesh-*

Golden files: ``python -m launcher generate --target T --mesh M --model tiny --image IMAGE`` byte
for byte. The JobSet and TrainJob are validated by kubeflow-trainer-api's pydantic models (a
round trip that must give back the input: unknown fields are dropped silently) and their pod
template, cut out as a Pod, by kubernetes-validate in strict mode (requirements-dev.txt pins both).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simcluster.launcher.job.entry import resolve_training
from simcluster.launcher.job.launch import NodeOptions
from simcluster.launcher.engines import jobset, trainjob
from simcluster.launcher.engines.slurm import render as slurm
from simcluster.launcher.engines.checks import has_registry
from simcluster.core.config import Config, resolve
from simcluster.core.errors import ConfigError
from simcluster.train.device import backend, mesh_device_type, process_group_device, rank_device

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
IMAGE = "registry.example.com/simcluster/trainer:latest"
SUFFIX = {"slurm": ".sbatch", "jobset": "-jobset.yaml", "trainjob": "-trainjob.yaml", "swarm": "-swarm.yml",
          "skypilot": "-skypilot.yaml"}


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "generate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def gen_doc(target: str, *args: str) -> str:
    proc = generate("--target", target, "--mesh", "2x2x2", "--model", "tiny", "--image", IMAGE, "--stdout", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("target", ["slurm", "jobset", "trainjob", "swarm", "skypilot"])
@pytest.mark.parametrize("mesh", ["2x2x2", "4x1x2"])
def test_golden_files(target, mesh):
    proc = generate("--target", target, "--mesh", mesh, "--model", "tiny", "--image", IMAGE, "--stdout")
    assert proc.returncode == 0, proc.stderr
    golden = GOLDEN / f"mesh-{mesh}{SUFFIX[target]}"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(proc.stdout, encoding="utf-8")
    assert proc.stdout == golden.read_text(encoding="utf-8"), f"regenerate: UPDATE_GOLDEN=1 pytest {__file__}"


def test_default_paths(tmp_path):
    from simcluster.launcher.engines.registry import ENGINES

    assert [ENGINES[t].out_path("mesh-2x2x2") for t in ENGINES] == [
        "compose/mesh-2x2x2.yml", "swarm/mesh-2x2x2.yml", "slurm/mesh-2x2x2.sbatch", "k8s/mesh-2x2x2-jobset.yaml",
        "k8s/mesh-2x2x2-trainjob.yaml", "skypilot/mesh-2x2x2.yaml"]


def _launch(device="cpu", **node):
    return resolve_training(Config(mesh="4x1x2", model="tiny", device=device), NodeOptions(image=IMAGE, **node))


def test_slurm_fields_and_node_rank():
    text = slurm.render(_launch("cuda", cpus_per_node=8, memory_per_node="3g"), "cmd")
    assert "#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=1\n" in text
    assert "#SBATCH --cpus-per-task=8" in text and "#SBATCH --mem=3072M" in text
    assert "#SBATCH --gpus-per-node=2" in text and "CUDA_VISIBLE_DEVICES" not in text
    assert '--node-rank "$SLURM_NODEID" --master-addr "$MASTER_ADDR"' in text
    assert "--rdzv-backend static -m simcluster.train" in text and "--device cuda" in text
    cpu = slurm.render(_launch(), "cmd")
    assert "--gpus-per-node" not in cpu and "export CUDA_VISIBLE_DEVICES=''" in cpu


def test_k8s_gpu_limits_and_node_rank():
    doc = jobset.build(_launch("cuda", cpus_per_node=2.5, memory_per_node="3g"))
    rj = doc["spec"]["replicatedJobs"][0]
    c = rj["template"]["spec"]["template"]["spec"]["containers"][0]
    assert rj["replicas"] == 4
    assert c["resources"]["limits"] == {"cpu": "2500m", "memory": "3Gi", "nvidia.com/gpu": "2"}
    assert c["command"][c["command"].index("--node-rank") + 1] == "$(NODE_RANK)"
    assert {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": jobset.JOB_INDEX}}} in c["env"]
    tj = trainjob.build(_launch("cuda"))["spec"]["trainer"]
    assert tj["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "2"}
    assert (tj["numNodes"], tj["numProcPerNode"]) == (4, 2)
    assert tj["command"][tj["command"].index("--node-rank") + 1] == "$(PET_NODE_RANK)"
    assert "nvidia.com/gpu" not in str(trainjob.build(_launch()))


def test_device_choice_is_pure():
    assert (backend("cpu"), backend("cuda")) == ("gloo", "nccl")
    assert (mesh_device_type("cpu"), mesh_device_type("cuda")) == ("cpu", "cuda")
    assert (rank_device("cpu", 3), rank_device("cuda", 3)) == ("cpu", "cuda:3")
    assert (process_group_device("cpu", 3), process_group_device("cuda", 3)) == (None, "cuda:3")
    with pytest.raises(ConfigError, match="device: unknown 'tpu'"):
        resolve(Config(device="tpu"))


def test_cuda_process_group_is_bound_to_the_rank_gpu(monkeypatch):
    """On cuda the trainer hands init_process_group the rank's GPU (NCCL's barriers then know their
    device); on cpu it leaves device_id out, which torch requires there."""
    import torch

    from simcluster.train import trainer

    calls = []
    monkeypatch.setattr(trainer.device, "bind", lambda device, local_rank: None)
    monkeypatch.setattr(trainer.dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(trainer.dist, "get_rank", lambda: 5)
    monkeypatch.setattr(trainer.dist, "get_world_size", lambda: 8)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert trainer.init_distributed(Config(device="cuda")) == (5, 1, 8)
    assert trainer.init_distributed(Config(device="cpu")) == (5, 1, 8)
    (nccl, on_gpu), (gloo, on_cpu) = calls
    assert (nccl, on_gpu["device_id"], gloo) == ("nccl", torch.device("cuda", 1), "gloo")
    assert "device_id" not in on_cpu and on_cpu["timeout"] == on_gpu["timeout"]


def test_cuda_without_gpu_names_the_fix():
    proc = subprocess.run([sys.executable, "-m", "train", "--model", "tiny", "--steps", "1", "--device", "cuda",
                           "--run-dir", "/tmp/sc-test-cuda"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0 and "LOCAL_RANK=0 has no GPU" in proc.stderr and "--device cpu" in proc.stderr


def _roundtrip(model, doc: dict) -> None:
    assert model.from_dict(doc).to_dict() == doc, "a field the model does not know was dropped"


def _pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node-0", **template.get("metadata", {})},
            "spec": template["spec"]}


@pytest.mark.parametrize("extra", [[], ["--cpus-per-node", "2", "--memory-per-node", "3g", "--device", "cuda",
                                        "--data", "README.md"]])
def test_jobset_validates(extra):
    import kubernetes_validate as kv  # pinned in requirements-dev.txt: missing is a failure, not a skip
    from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet

    doc = yaml.safe_load(gen_doc("jobset", *extra))
    _roundtrip(JobsetV1alpha2JobSet, doc)  # the package models the top-level JobSet
    template = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    kv.validate(_pod(template), "1.37", strict=True)
    bad = yaml.safe_load(gen_doc("jobset"))
    bad["spec"]["replicatedJobs"][0]["replica"] = 2  # a typo must not pass the round trip
    with pytest.raises(AssertionError):
        _roundtrip(JobsetV1alpha2JobSet, bad)


@pytest.mark.parametrize("extra", [[], ["--cpus-per-node", "2", "--memory-per-node", "3g", "--device", "cuda"]])
def test_trainjob_validates(extra):
    import kubernetes_validate as kv  # pinned in requirements-dev.txt: missing is a failure, not a skip
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    doc = yaml.safe_load(gen_doc("trainjob", *extra))
    _roundtrip(TrainerV1alpha1TrainJob, doc)
    # the pod the torch runtime makes: the trainer's container merged with the runtime patch
    tr = doc["spec"]["trainer"]
    patch = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    spec = dict(patch["template"]["spec"]["template"]["spec"])
    c = {"name": "node", "image": tr["image"], "command": tr["command"], "env": tr["env"],
         **({"resources": tr["resourcesPerNode"]} if "resourcesPerNode" in tr else {}), **spec["containers"][0]}
    kv.validate(_pod({"spec": {**spec, "restartPolicy": "Never", "containers": [c]}}), "1.37", strict=True)


@pytest.mark.parametrize("target", ["jobset", "trainjob"])
def test_image_without_registry_exits_2(tmp_path, target):
    out = tmp_path / "x.yaml"
    proc = generate("--target", target, "--mesh", "2x2x2", "--out", str(out))
    assert proc.returncode == 2 and "push it to a registry" in proc.stderr and "--image registry.example.com/" in proc.stderr
    assert not out.exists()
    assert has_registry("ghcr.io/a/b:1") and has_registry("localhost:5000/x") and not has_registry("simcluster/trainer")


@pytest.mark.parametrize("target", ["nomad", "k3s"])
def test_unknown_target_exits_2(tmp_path, target):
    proc = generate("--target", target, "--mesh", "2x2x2", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and f"invalid choice: '{target}'" in proc.stderr and not list(tmp_path.iterdir())


def test_user_code_folder_refused_off_compose(tmp_path):
    proc = generate("--target", "slurm", "--nodes", "2", "--nproc-per-node", "2", "--script", "examples/ddp.py",
                    "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "bake it into an image" in proc.stderr


@pytest.mark.parametrize("target", ["jobset", "trainjob"])
def test_job_arguments_reach_argv_unchanged_after_kubelet_expansion(target):
    """The kubelet expands $(NAME) in command and args from the container's environment and reads
    $$ as $: the user's arguments are written so that the expansion gives them back as typed."""
    from test_engines_docker import _pods

    args = ["--note", "$(HOME) $x", "$$", "$(NODE_RANK)$(PET_NODE_RANK)", "$$(X)", "end$"]
    proc = generate("--target", target, "--nodes", "2", "--nproc-per-node", "1", "--module", "mypkg.train",
                    "--image", IMAGE, "--stdout", "--", *args)
    assert proc.returncode == 0, proc.stderr
    _, pods = _pods(target, yaml.safe_load(proc.stdout))
    for _, command, env in pods:
        assert "NODE_RANK" in env or "PET_NODE_RANK" in env  # names the expansion would replace
        assert command[-len(args) - 2:] == ["-m", "mypkg.train", *args], command
        assert command[command.index("--node-rank") + 1].isdigit()  # the launcher's own $(...) still expands


def test_compose_nodes_fork_the_users_code_unless_torchrun_is_asked():
    """The node wrapper forks the user's script's ranks after one import per node, as the
    trainer's (``--torchrun``, a node option, gives each rank a fresh interpreter instead)."""
    from simcluster.launcher.job.entry import resolve_code
    from simcluster.launcher.engines.compose.render import node_command

    script = str(Path(__file__).resolve().parent.parent / "examples" / "ddp.py")
    forked = node_command(resolve_code(NodeOptions(), script=script, nodes=2, nproc_per_node=2), 1)
    stock = node_command(resolve_code(NodeOptions(torchrun=True), script=script, nodes=2, nproc_per_node=2), 1)
    assert "--script" in forked and "--torchrun" not in forked
    assert stock[stock.index("--"):] == forked[forked.index("--"):] and "--torchrun" in stock[:stock.index("--")]
