"""A hang's Flight Recorder dumps: written as a real cluster's job is told to, read by `launcher diagnose`.

    python -m pytest -q tests/test_diagnose.py

One real hang on the host (torchrun, 4 gloo ranks, examples/hang.py --kind skip, the instruments
and the environment the Slurm, JobSet and TrainJob documents carry): the stall watch writes each
rank's dump with torch's recorder; `launcher diagnose` names the same disagreement as the stall
watch's hang.json, and torch's own analyzer ``fr_trace`` reads the same files ("missing ranks").
Bad input on those real files: a truncated dump, a pickle that would build an object, a folder of
none, a dump of another job (a 2-rank job's, written by the same recorder), each exit 2 naming the
file and the fix.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_torch

from simcluster.launcher.engines import jobset, trainjob
from simcluster.launcher.engines.slurm import render as slurm
from simcluster.launcher.job.entry import resolve_training
from simcluster.launcher.job.launch import NodeOptions
from simcluster.core.config import Config
from simcluster.core.flightrec import DUMP_DIR, FILE_PREFIX, dump_env

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "launcher" / "instrument" / "boot"
SHARED = "ranks 0, 2, 3 wait in all_reduce #3 of group [0, 1, 2, 3] (hang.py:64); rank 1 never entered it, it "
OTHER_JOB = """
import torch, torch.distributed as dist
from simcluster.train.commstate import group_table
from simcluster.train.flightrec import write_dump
dist.init_process_group("gloo")
x = torch.ones(2)
dist.all_reduce(x)
write_dump(dist.get_rank(), group_table())
dist.destroy_process_group()
"""


def _torchrun(tmp: Path, nproc: int, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {**os.environ, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_env(str(tmp))["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"], **env}
    return subprocess.run(["torchrun", "--standalone", "--nproc-per-node", str(nproc), script, *args], cwd=tmp,
                          env=base, capture_output=True, text=True, timeout=300)


def diagnose(folder, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", "diagnose", str(folder)], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def hang(tmp_path_factory) -> Path:
    """The run folder of a real hang on the host: hang.json and flight-recorder/ (4 dumps)."""
    need_torch()
    tmp = tmp_path_factory.mktemp("hang")
    proc = _torchrun(tmp, 4, str(ROOT / "examples" / "hang.py"), "--kind", "skip", SIMCLUSTER_INSTRUMENT="1",
                     SIMCLUSTER_OUTPUT_DIR=str(tmp), SIMCLUSTER_STALL_S="3")
    assert "exitcode  : 4" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    return tmp


def test_diagnose_names_the_stall_watchs_disagreement_from_the_dumps(hang):
    assert sorted(os.listdir(hang / DUMP_DIR)) == [f"{FILE_PREFIX}{r}" for r in range(4)]
    watch = json.loads((hang / "hang.json").read_text())["diagnosis"]
    assert watch[0].startswith("HANG at step 3 after ") and SHARED + "waits in recv #1 from rank 0 (hang.py:59)" in watch[0]
    proc = diagnose(hang, hang)  # the run folder: its flight-recorder/ is read
    assert proc.returncode == 0, proc.stderr
    # gloo's Flight Recorder keeps no send/recv: rank 1 is named by its last collective, completed
    assert proc.stdout == (f"HANG in the Flight Recorder dumps of 4 ranks: {SHARED}is in no collective since "
                           "all_reduce #3 of group [0, 1] completed (hang.py:45)\n"), proc.stdout
    assert proc.stderr == ""


def test_torchs_fr_trace_reads_the_same_files(hang):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(hang / DUMP_DIR)],
                          cwd=hang, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for line in ("Not all ranks joining collective, sequence number: 3", "group info: 0:default_pg",
                 "collective: gloo:all_reduce", "missing ranks: {1}"):
        assert line in out, out[-3000:]


def test_bad_dumps_exit_2_naming_the_file_and_the_fix(hang, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(hang / DUMP_DIR, cut)
    data = (cut / f"{FILE_PREFIX}2").read_bytes()
    (cut / f"{FILE_PREFIX}2").write_bytes(data[: len(data) // 2])
    proc = diagnose(cut, ROOT)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert f"{cut}/{FILE_PREFIX}2: it ends early (truncated" in proc.stderr and "remove it, or give the folder" in proc.stderr

    shutil.copy(hang / DUMP_DIR / f"{FILE_PREFIX}2", cut / f"{FILE_PREFIX}2")
    (cut / f"{FILE_PREFIX}3").write_bytes(pickle.dumps(Path("x")))  # a pickle that would build an object: never loaded
    proc = diagnose(cut, ROOT)
    assert proc.returncode == 2 and f"{FILE_PREFIX}3: it is no Flight Recorder dump (UnpicklingError: it names " \
        "pathlib.PosixPath, which a Flight Recorder dump never does)" in proc.stderr, proc.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = diagnose(empty, ROOT)
    assert proc.returncode == 2 and f"diagnose {empty}: no Flight Recorder dumps in it" in proc.stderr, proc.stderr
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=RUN_DIR/flight-recorder/nccl_trace_rank_" in proc.stderr

    other = tmp_path / "other"  # a 2-rank job's dumps, by the same recorder
    other.mkdir()
    (other / "job.py").write_text(OTHER_JOB)
    assert _torchrun(other, 2, "job.py").returncode == 0
    mixed = tmp_path / "mixed"
    shutil.copytree(hang / DUMP_DIR, mixed)
    shutil.copy(other / DUMP_DIR / f"{FILE_PREFIX}1", mixed / f"{FILE_PREFIX}1")
    proc = diagnose(mixed, ROOT)
    assert proc.returncode == 2, proc.stdout
    assert (f"{mixed}/{FILE_PREFIX}1: group 0 has ranks [0, 1], in {mixed}/{FILE_PREFIX}0 [0, 1, 2, 3]: dumps of "
            "different jobs") in proc.stderr, proc.stderr


def test_each_real_cluster_document_turns_the_dump_on_into_the_run_folder():
    launch = resolve_training(Config(mesh="2x1x1", model="tiny"), NodeOptions())
    env = dump_env("/runs/x")
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"/runs/x/{DUMP_DIR}/{FILE_PREFIX}" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # the watchdog waits longer for the dump than torch's 15 s, and the heartbeat monitor longer still
    assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) * 1000 > int(env["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"]) > 15000
    text = slurm.render(launch, "cmd")
    prefix = f'export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$SIMCLUSTER_WORKDIR"/{launch.run_dir}/{DUMP_DIR}/{FILE_PREFIX}\n'
    assert prefix in text and f"mkdir -p {launch.run_dir}/{DUMP_DIR}" in text
    job = jobset.build(launch)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    tj = trainjob.build(launch)["spec"]["trainer"]
    for command, entries in ((job["command"], job["env"]), (tj["command"], tj["env"])):
        assert command[:3] == ["sh", "-c", f'mkdir -p {launch.output_dir}/{DUMP_DIR} && exec "$0" "$@"']
        assert command[3] == "torchrun"
        assert {e["name"]: e.get("value") for e in entries}["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == \
            dump_env(launch.output_dir)["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    # your --env changes it, in place (never a second export that the first would hide)
    proc = subprocess.run([sys.executable, "-m", "launcher", "generate", "--target", "slurm", "--mesh", "2x1x1", "--model",
                           "tiny", "--stdout", "--env", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/scratch/fr/r_"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=") == 1, proc.stderr
    assert "export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/scratch/fr/r_\n" in proc.stdout
