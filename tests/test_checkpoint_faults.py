"""Checkpoints under faults: a save killed at any moment leaves the newest complete checkpoint
loadable; a full disk during a save gives a clear error and keeps the previous checkpoint.

    python -m pytest -q tests/test_checkpoint_faults.py

One process (a one-node mesh), the tiny model, a checkpoint every step (5.5 MB each). The kill
drill SIGKILLs the whole process group at 12 seeded random moments after a new checkpoint
(two run folders side by side, 6 each);
the full-disk drill runs on a 9 MB tmpfs (root only: mount; under CI=true it must work).
About a minute.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import warm
from conftest import need, need_torch
from simcluster.train.checkpoint_paths import list_checkpoints
from simcluster.core.config import Config
from simcluster.train.preflight import preflight

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train(run: Path, *flags: str) -> list[str]:
    """The arguments of ``python -m train`` here, which runs forked from the worker's warm
    interpreter (tests/warm.py: torch and the trainer imported once, not once a run)."""
    return ["--model", "tiny", "--run-dir", str(run), "--ckpt-every", "1", "--ckpt-keep", "2", "--val-every", "0",
            *flags]


KILLS, CHAINS = 12, 2  # 12 seeded kill moments, taken by two run folders side by side (6 each)
_preflight_lock = threading.Lock()


def _killed_chain(run: Path, delays: list[float]) -> None:
    """One run folder: per delay, train (resume auto), wait for a new checkpoint, SIGKILL the process
    group ``delay`` s later (somewhere in the next saves); the newest checkpoint must pass preflight
    each time; at the end a plain resume continues from it, to its end."""
    newest = None
    for delay in delays:
        proc = warm.start("train", train(run, "--steps", "400", "--resume", "auto"), cwd=ROOT, env=ENV)
        before = len(list_checkpoints(str(run / "checkpoints")))
        t0 = time.monotonic()
        while len(list_checkpoints(str(run / "checkpoints"))) <= before and proc.poll() is None \
                and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        newest = list_checkpoints(str(run / "checkpoints"))[-1][1]
        with _preflight_lock:  # in this process: one at a time
            preflight(Config(model="tiny", steps=400, val_every=0, run_dir=str(run), resume="auto"))  # checks it
        assert json.loads((Path(newest) / "simcluster.json").read_text())["step"] >= 1, newest
    step = int(Path(newest).name.split("-")[1])
    # three steps past the checkpoint (not to step 400: 0.1 s a step of nothing more to check)
    resumed = warm.run("train", train(run, "--steps", str(step + 3), "--resume", "auto", "--ckpt-every", "0"),
                       cwd=ROOT, env=ENV, timeout=600)
    assert resumed.returncode == 0 and f"resumed from {newest} at step {step}" in resumed.stdout, resumed.stderr[-2000:]


def test_killed_saves_leave_a_loadable_checkpoint(tmp_path):
    """12 seeded kill moments (the same draws as one chain of 12 had), dealt to two run folders that
    run side by side (each training process is single-threaded, so two fit the 2 cores): every
    kill leaves a loadable newest checkpoint and each folder resumes from it."""
    need_torch()
    rng = random.Random(12)
    delays = [rng.uniform(0.0, 0.6) for _ in range(KILLS)]
    with ThreadPoolExecutor(CHAINS) as pool:
        chains = [pool.submit(_killed_chain, tmp_path / f"run-{c}", delays[c::CHAINS]) for c in range(CHAINS)]
        for chain in chains:
            chain.result()  # re-raises a chain's failed assertion


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=9m", "tmpfs", str(disk)], capture_output=True).returncode:
        need("cannot mount a tmpfs here (root needed) for the full-disk drill")
    yield disk
    subprocess.run(["umount", str(disk)], capture_output=True)


def test_full_disk_during_a_save_keeps_the_previous_checkpoint(small_disk):
    need_torch()
    run = small_disk / "run"
    proc = warm.run("train", train(run, "--steps", "5"), cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "error: rank 0: checkpoint step 2: cannot write" in proc.stderr, proc.stderr
    free = float(re.search(r"\(([\d.]+) MB free on that filesystem\)", proc.stderr).group(1))
    assert free < 5.5  # less than one checkpoint: the disk is what is full
    assert f"the previous checkpoint {run}/checkpoints/step-000001 is kept" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [Path(p).name for _, p in list_checkpoints(str(run / "checkpoints"))] == ["step-000001"]
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())
    preflight(Config(model="tiny", steps=5, run_dir=str(run), resume=str(run / "checkpoints")))  # still loadable


def test_torchrun_restart_resumes_with_resume_auto(tmp_path):
    """torchrun --max-restarts 1 with --resume auto: a rank killed mid-run, the group restarts and
    continues from the newest checkpoint; metrics.jsonl has each step once. The restarted ranks
    need a fresh store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): with torch's default, the store
    shared with the agent, gloo's connectFullMesh of the new round could read the killed round's
    addresses and fail with "Connection refused" (seen in a CI run)."""
    need_torch()
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
           "1", "-m", "train", "--mesh", "2x1x1", "--model", "tiny", "--steps", "30", "--ckpt-every", "5",
           "--resume", "auto", "--run-dir", str(run), "--timeout-s", "20"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 240:
        rows = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
        if len(rows) >= 12:
            break
        time.sleep(0.2)
    from simcluster.launcher.container.ranks import rank_processes

    victim, _state = rank_processes(proc.pid, 0)[1]  # rank 1's process, by its RANK
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    resumed = re.search(r"\[simcluster\] resumed from \S+/step-(\d+) at step (\d+)", out)
    assert resumed and int(resumed.group(2)) >= 10, out[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))
