"""From the rehearsal to a GPU cluster (issue 55), without Docker: a GPU program's job asks for its GPUs on every
target, runs the image rehearsed (pyxis, --push), and the SkyPilot task passes SkyPilot's own schema.

    python -m pytest -q -n 0 tests/test_gpu_targets.py

SkyPilot's schema functions are loaded from the pinned package (.ci/requirements-sky.txt, installed with
--no-deps: its package's __init__ pulls a server stack of ~50 packages): sky/utils/schemas.py and the modules
it imports at the top (sky.skylet.constants, sky.setup_files.dependencies, sky.utils.kubernetes_enums) as
they are, under a bare ``sky`` package; of sky.skylet.autostop_lib its AutostopWaitFor enum alone (its
module imports the logging stack), and sky.server.daemons as an empty list of daemons (read only by the
``config.daemons`` part of a task's schema, which these tasks do not use).
"""
from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import types
from importlib.metadata import version
from pathlib import Path

import jsonschema
import pytest
import yaml

from simcluster.launcher.engines.gpus import names_of
from simcluster.core.hardware import GPU_NAMES

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "registry.example.com/me/trainer:1"
GPU_PROGRAM = ("--nodes", "2", "--nproc-per-node", "4", "--module", "mypkg.train", "--image", IMAGE)


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "generate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def doc(target: str, *args: str) -> str:
    proc = generate("--target", target, *GPU_PROGRAM, "--stdout", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _k8s_gpu(target: str, text: str) -> tuple[dict, dict, list[str]]:
    """(limits, nodeSelector, env names) of a JobSet's or TrainJob's node."""
    d = yaml.safe_load(text)
    if target == "jobset":
        pod = d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        return c.get("resources", {}).get("limits", {}), pod.get("nodeSelector", {}), [e["name"] for e in c["env"]]
    tr = d["spec"]["trainer"]
    patch = d["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return (tr.get("resourcesPerNode", {}).get("limits", {}), patch["template"]["spec"]["template"]["spec"]
            .get("nodeSelector", {}), [e["name"] for e in tr["env"]])


def test_a_gpu_program_asks_for_one_gpu_per_rank_everywhere():
    slurm = doc("slurm")
    assert "#SBATCH --gpus-per-node=4\n" in slurm and "CUDA_VISIBLE_DEVICES" not in slurm
    for target in ("jobset", "trainjob"):
        limits, selector, env = _k8s_gpu(target, doc(target))
        assert limits == {"nvidia.com/gpu": "4"} and selector == {} and "GLOO_SOCKET_IFNAME" not in env, target
        assert not [n for n in env if n.startswith("SIMCLUSTER_") and n not in ("SIMCLUSTER_NNODES", "SIMCLUSTER_NODE")], env
    sky = yaml.safe_load(doc("skypilot"))
    assert sky["resources"]["accelerators"] == "H100:4" and sky["num_nodes"] == 2
    assert '--nproc-per-node "$SKYPILOT_NUM_GPUS_PER_NODE" --node-rank "$SKYPILOT_NODE_RANK"' in sky["run"]
    assert 'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)' in sky["run"]


def test_gpu_names_the_model_in_each_engines_words():
    assert "#SBATCH --gpus-per-node=a100:4\n" in doc("slurm", "--gpu", "a100-80g")
    for target in ("jobset", "trainjob"):
        limits, selector, _ = _k8s_gpu(target, doc(target, "--gpu", "a100-80g"))
        assert limits == {"nvidia.com/gpu": "4"} and selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert yaml.safe_load(doc("skypilot", "--gpu", "h100-sxm-8x"))["resources"]["accelerators"] == "H100:4"
    assert {g: names_of(g).skypilot for g in GPU_NAMES} == {"h100-sxm": "H100", "a100-80g": "A100-80GB",
                                                            "h100-sxm-8x": "H100", "a100-80g-8x": "A100-80GB",
                                                            "h100-96g": "H100", "h200": "H200"}


def test_a_cpu_job_asks_for_none():
    slurm = doc("slurm", "--no-simulated-gpus")
    assert "--gpus-per-node" not in slurm and "export CUDA_VISIBLE_DEVICES=''" in slurm
    for target in ("jobset", "trainjob"):
        limits, _, env = _k8s_gpu(target, doc(target, "--no-simulated-gpus"))
        assert "nvidia.com/gpu" not in limits and "GLOO_SOCKET_IFNAME" in env
    sky = yaml.safe_load(doc("skypilot", "--no-simulated-gpus"))
    assert "accelerators" not in sky["resources"] and "--nproc-per-node 4 " in sky["run"]


def test_pyxis_runs_the_image_rehearsed():
    plain = doc("slurm")
    assert "--container-image" not in plain and "SIMCLUSTER_SETUP=${SIMCLUSTER_SETUP:-'source .venv/bin/activate'}" in plain
    pyxis = doc("slurm", "--pyxis")
    assert f"--container-image={IMAGE} --container-mounts=" in pyxis and "SIMCLUSTER_SETUP=${SIMCLUSTER_SETUP:-true}" in pyxis
    same = doc("slurm", "--container-image", IMAGE.replace("/", "#", 1))  # enroot's form of the same image
    assert f"--container-image={IMAGE.replace('/', '#', 1)}" in same
    assert yaml.safe_load(doc("skypilot"))["resources"]["image_id"] == f"docker:{IMAGE}"


@pytest.mark.parametrize("target, args, message", [
    ("swarm", ("--gpu", "a100-80g"), "--gpu a100-80g: a stack reserves GPUs as a count of the NVIDIA-GPU generic "
                                     "resource and cannot name a model"),
    ("slurm", ("--container-image", "nvcr.io/nvidia/pytorch:24.05-py3"), "--container-image nvcr.io/nvidia/pytorch:"
     f"24.05-py3 and --image {IMAGE} name two images: the image rehearsed here is the one that should run there; "
     f"give one, e.g. --image {IMAGE} --pyxis"),
    ("compose", ("--push", "localhost:5000"), "--push localhost:5000: a compose document runs the image of this "
                                              "machine's Docker and pulls none from a registry; drop --push"),
    ("slurm", ("--push", "localhost:5000"), "--push localhost:5000: a slurm document without --pyxis runs no image"),
    ("jobset", ("--push", "http://x"), "push: 'http://x' is not a registry"),
    ("jobset", ("--push", "127.0.0.1:9"), "--push 127.0.0.1:9: no Docker registry answers at 127.0.0.1:9/v2/ ("),
])
def test_what_a_target_cannot_do_exits_2_writing_nothing(tmp_path, target, args, message):
    out = tmp_path / "job.yaml"
    proc = generate("--target", target, *GPU_PROGRAM, "--out", str(out), *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not out.exists()


def test_pyxis_with_a_local_image_names_the_push():
    proc = generate("--target", "slurm", "--nodes", "2", "--nproc-per-node", "4", "--module", "m", "--pyxis", "--stdout")
    assert proc.returncode == 2 and "--image simcluster/trainer:latest: a slurm job runs on other hosts" in proc.stderr


def test_up_refuses_what_only_a_real_cluster_has():
    from simcluster.launcher.engines.registry import engine_named
    from simcluster.launcher.job.options import resolve
    from simcluster.launcher.job.request import make_request
    from simcluster.launcher.job.sections import UpOptions
    from simcluster.core.errors import ConfigError

    for extra, message in (({"pyxis": True}, "--pyxis: the simulated Slurm here has no pyxis"),
                           ({"push": "localhost:5000"}, "--push localhost:5000: an option of `generate`")):
        req = make_request("up", module="m", image=IMAGE, nodes=2, nproc_per_node=2, target="slurm", run_dir="runs/g",
                           **extra)
        with pytest.raises(ConfigError, match=message):
            engine_named("slurm").check(resolve(req, "1000:1000")[0], req.section(UpOptions))


@pytest.fixture(scope="module")
def sky_schemas():
    """sky.utils.schemas of the installed skypilot (see the module docstring for what is loaded how), with its
    modules in sys.modules while the tests call it (its functions import more of them lazily)."""
    root = importlib.util.find_spec("sky").submodule_search_locations[0]  # pinned: missing is a failure
    saved = {k: v for k, v in sys.modules.items() if k == "sky" or k.startswith("sky.")}
    pkg = types.ModuleType("sky")
    pkg.__path__, pkg.__version__ = [root], version("skypilot")
    tree = ast.parse(Path(root, "skylet", "autostop_lib.py").read_text())
    keep = [n for n in tree.body if (isinstance(n, ast.ClassDef) and n.name == "AutostopWaitFor") or (
        isinstance(n, (ast.Import, ast.ImportFrom)) and not (getattr(n, "module", None) or "").startswith("sky")
        and not any(a.name.startswith("sky") for a in n.names))]
    autostop, daemons = types.ModuleType("sky.skylet.autostop_lib"), types.ModuleType("sky.server.daemons")
    exec(compile(ast.Module(keep, []), str(Path(root, "skylet", "autostop_lib.py")), "exec"), autostop.__dict__)
    daemons.INTERNAL_REQUEST_DAEMONS = []
    sys.modules.update({"sky": pkg, "sky.skylet.autostop_lib": autostop, "sky.server.daemons": daemons})
    try:
        yield importlib.import_module("sky.utils.schemas")
    finally:
        for k in [k for k in sys.modules if k == "sky" or k.startswith("sky.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize("args", [(), ("--gpu", "a100-80g", "--cpus-per-node", "8", "--memory-per-node", "3g"),
                                  ("--no-simulated-gpus",)])
def test_skypilot_task_passes_skypilots_schema(sky_schemas, args):
    schemas = sky_schemas
    assert version("skypilot") == "0.14.1"
    task = yaml.safe_load(doc("skypilot", *args))
    jsonschema.validate(task, schemas.get_task_schema())
    jsonschema.validate(task["resources"], schemas.get_resources_schema())
    with pytest.raises(jsonschema.ValidationError, match="'num_node' was unexpected"):
        jsonschema.validate({**task, "num_node": 2}, schemas.get_task_schema())
    with pytest.raises(jsonschema.ValidationError, match="'accelerator' was unexpected"):
        jsonschema.validate({**task["resources"], "accelerator": "H100:4"}, schemas.get_resources_schema())


@pytest.mark.parametrize("target", ["jobset", "trainjob"])
def test_gpu_documents_pass_the_published_apis(target):
    """A GPU program's JobSet and TrainJob (limits, the --gpu nodeSelector) through Kubeflow Trainer v2.3's models
    (kubeflow-trainer-api 2.3.0, generated from its OpenAPI: a round trip that drops no field) and their pod,
    cut out as a Pod, through kubernetes-validate (strict, 1.37)."""
    import kubernetes_validate as kv
    from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    from test_targets import _pod, _roundtrip

    d = yaml.safe_load(doc(target, "--gpu", "a100-80g", "--cpus-per-node", "8", "--memory-per-node", "3g"))
    _roundtrip(JobsetV1alpha2JobSet if target == "jobset" else TrainerV1alpha1TrainJob, d)
    if target == "jobset":
        pod = d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    else:
        tr, patch = d["spec"]["trainer"], d["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
        spec = dict(patch["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])
        c = {"name": "node", "image": tr["image"], "command": tr["command"], "env": tr["env"],
             "resources": tr["resourcesPerNode"], **spec["containers"][0]}
        pod = {"spec": {**spec, "restartPolicy": "Never", "containers": [c]}}
        assert d["metadata"]["labels"]["simcluster.io/kubeflow-trainer"] == "v2.3"
    kv.validate(_pod(pod), "1.37", strict=True)
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
