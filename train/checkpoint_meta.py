"""What a checkpoint was made with: RUN_DIR/checkpoints/step-NNNNNN/simcluster.json, beside the
DCP files, and the resume check against it. Torch-free, so preflight compares before anything starts.

    python -m train --model tiny --steps 10 --resume runs/a/checkpoints   # exits 2 if the shape differs
    python -c "import json; print(json.load(open('runs/a/checkpoints/step-000010/simcluster.json'))['model'])"

The record holds the model shape, seq_len, global_batch, seed and data identity (these must match
to continue exactly: the batch of a step is a function of seed, step, global batch and corpus),
the optimizer hyperparameters (lr, min_lr, warmup_steps, steps, weight_decay, max_norm: a resume
may change them, and they are then applied and announced), the mesh, schedule, versions (torch,
python, the project's git commit or null) and every DCP file's size (a truncated or missing file
is refused before loading).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import subprocess

from simcluster.train.checkpoint_paths import list_checkpoints, resolve_resume
from simcluster.core.config import TrainRun

META = "simcluster.json"
FORMAT = 1
HYPER = ("lr", "min_lr", "warmup_steps", "steps", "weight_decay", "max_norm")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed: missing, partial, corrupted or from another run; the
    message names the file (or the differing fields) and a fix."""


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The project's git commit (HEAD of the checkout holding train/), or None (no git, no repo)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def torch_version() -> str | None:
    """torch's version without importing it (None where torch is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def data_identity(run: TrainRun) -> dict:
    """The corpus of a run (``train.corpus.data_identity``); the seed model's data is synthetic."""
    if run.model.kind == "seed":
        return {"name": "synthetic (seed model)"}
    from simcluster.train.corpus import data_identity as corpus_identity

    return corpus_identity(run.config.data)


def make_record(run: TrainRun, step: int, data: dict) -> dict:
    """The JSON record of a checkpoint of ``run`` at ``step`` (``files`` is added at save)."""
    cfg = run.config
    return {
        "format": FORMAT, "step": step, "samples": step * cfg.global_batch,
        "model": dataclasses.asdict(run.model), "seq_len": cfg.seq_len, "global_batch": cfg.global_batch,
        "seed": cfg.seed, "data": data, "optimizer": {k: getattr(cfg, k) for k in HYPER},
        "mesh": cfg.mesh, "schedule": cfg.schedule, "microbatches": cfg.microbatches,
        "versions": {"torch": torch_version(), "python": platform.python_version(), "commit": git_commit()},
    }


def write_record(folder: str, record: dict) -> None:
    """Write ``record`` with the sizes of every file now in ``folder`` into folder/simcluster.json."""
    files = {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder)) if n != META}
    with open(os.path.join(folder, META), "w", encoding="utf-8") as fh:
        json.dump({**record, "files": files}, fh, indent=1, sort_keys=True)


def read_record(path: str) -> dict:
    """The record of checkpoint folder ``path``, after checking its files are all there, whole.

    Raises:
        CheckpointError: simcluster.json missing or unreadable, a DCP file missing or of
            another size than saved; the message names the file.
    """
    meta = os.path.join(path, META)
    fix = "resume from another checkpoint (or --resume auto), or start fresh without --resume"
    try:
        with open(meta, encoding="utf-8") as fh:
            rec = json.load(fh)
    except FileNotFoundError:
        raise CheckpointError(f"resume: {meta} is missing (a partial copy, or a checkpoint made before "
                              f"checkpoints recorded their config); {fix}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"resume: {meta} is unreadable or corrupted ({e}); {fix}") from None
    needed = {"format", "step", "samples", "model", "seq_len", "global_batch", "seed", "data", "optimizer", "files"}
    if not isinstance(rec, dict) or needed - set(rec):
        missing = sorted(needed - set(rec)) if isinstance(rec, dict) else ["everything"]
        raise CheckpointError(f"resume: {meta} is corrupted (missing {', '.join(missing)}); {fix}")
    for name, size in rec["files"].items():
        f = os.path.join(path, name)
        if not os.path.isfile(f):
            raise CheckpointError(f"resume: {f} is missing (the checkpoint is partial); {fix}")
        if os.path.getsize(f) != size:
            raise CheckpointError(f"resume: {f} has {os.path.getsize(f)} bytes, {size} when saved "
                                  f"(truncated or corrupted); {fix}")
    return rec


def resume_path(run: TrainRun) -> str | None:
    """The checkpoint folder to resume from: ``--resume auto`` takes the newest complete one of
    RUN_DIR/checkpoints (None when there is none: a fresh start); a path goes through
    ``resolve_resume``.

    Raises:
        FileNotFoundError: a path (not auto) with no complete checkpoint.
    """
    resume = run.config.resume
    if resume is None:
        return None
    if resume == "auto":
        found = list_checkpoints(os.path.join(run.config.run_dir, "checkpoints"))
        return found[-1][1] if found else None
    return resolve_resume(resume)


FLAGS = {"dim": "--dim", "n_layers": "--n-layers", "n_heads": "--n-heads", "ffn_dim": "--ffn-dim",
         "kind": "--model", "vocab_size": "--model", "norm_eps": "--model", "rope_theta": "--model"}


def compare(saved: dict, run: TrainRun, path: str) -> tuple[list[str], list[str]]:
    """(refusals, notes) of resuming ``run`` from the checkpoint recorded as ``saved`` at ``path``.

    Refusals: what cannot continue exactly (model shape, seq_len, global_batch, seed, data),
    one line per field naming the saved value and the flag that restores it; also a step count
    already reached. Notes: hyperparameters changed on purpose (one line, old -> new), and a
    changed mesh, schedule or torch version.
    """
    cfg, errors = run.config, []
    fix = "or start a fresh run (another --run-dir, without --resume)"
    model = dataclasses.asdict(run.model)
    for k, old in saved["model"].items():
        if model.get(k) != old:
            errors.append(f"resume: model {k}={model.get(k)} differs from the checkpoint's {old} ({path}); "
                          f"{_flag_value(k, old, saved)} to continue it, {fix}")
    for k in ("seq_len", "global_batch", "seed"):
        if getattr(cfg, k) != saved[k]:
            why = " (the data order would change: steps would repeat or skip samples)" if k != "seq_len" else ""
            errors.append(f"resume: {k}={getattr(cfg, k)} differs from the checkpoint's {saved[k]}{why} ({path}); "
                          f"pass --{k.replace('_', '-')} {saved[k]} to continue it, {fix}")
    data = data_identity(run)
    if data != saved["data"]:
        diff = ", ".join(f"{k} {saved['data'].get(k)} -> {data.get(k)}" for k in sorted(set(data) | set(saved["data"]))
                         if data.get(k) != saved["data"].get(k))
        errors.append(f"resume: data differs from the checkpoint's ({diff}) ({path}); pass the same --data as the "
                      f"saved run ({saved['data'].get('name')}, {saved['data'].get('bytes')} bytes), {fix}")
    if saved["step"] >= cfg.steps:
        errors.append(f"steps: {cfg.steps} <= the checkpoint's step {saved['step']} ({path}): nothing to train; "
                      f"pass --steps {saved['step'] + 1} or more")
    notes = []
    changed = [f"{k} {saved['optimizer'].get(k)} -> {getattr(cfg, k)}" for k in HYPER
               if saved["optimizer"].get(k) != getattr(cfg, k)]
    if changed:
        notes.append("resume: hyperparameters changed since the checkpoint, applied: " + ", ".join(changed))
    moved = [f"{k} {saved.get(k)} -> {getattr(cfg, k)}" for k in ("mesh", "schedule") if saved.get(k) != getattr(cfg, k)]
    if moved:
        notes.append("resume: resharded onto " + ", ".join(moved))
    versions = saved.get("versions") or {}
    if versions.get("torch") != torch_version():
        notes.append(f"resume: checkpoint saved with torch {versions.get('torch')}, running {torch_version()}")
    return errors, notes


def _flag_value(k: str, old, saved: dict) -> str:
    if FLAGS.get(k, "--model") == "--model":
        return f"use the checkpoint's model (kind {saved['model'].get('kind')}, its preset's {k})"
    return f"pass {FLAGS[k]} {old}"


def check_resume(run: TrainRun) -> tuple[str | None, list[str], list[str]]:
    """(checkpoint folder or None, errors, notes) of ``run``'s --resume: path found, files whole,
    record matching. Errors name the file or the field and a fix; never raises."""
    try:
        path = resume_path(run)
    except FileNotFoundError as e:
        return None, [f"{e}; pass a step-NNNNNN folder, a run's checkpoints/ folder, or --resume auto"], []
    if path is None:
        return None, [], []
    try:
        saved = read_record(path)
    except CheckpointError as e:
        return path, [str(e)], []
    errors, notes = compare(saved, run, path)
    return path, errors, notes
