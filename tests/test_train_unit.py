"""Unit tests of train/: mesh and config parsing, preflight, the stage split, model shapes, data.

    python -m pytest -q tests/test_train_unit.py
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from simcluster.core.flags import add_config_args, config_from_args
from simcluster.core.config import PRESETS, Config, MeshSpec, parse_mesh, resolve
from simcluster.core.errors import ConfigError
from simcluster.train.data import Corpus, dp_shard, lm_batch, load_corpus, seed_batch, train_val_split
from simcluster.train.model import build_model, loss_fn, prune_to_stage
from simcluster.train.optim import kernel_flags
from simcluster.train.pipeline import stage_io
from simcluster.train.preflight import check
from simcluster.train.split import split_layers, stage_ids

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("spec,expected", [("2x2x2", (2, 2, 2)), ("4x1x2", (4, 1, 2)), ("1x1x1", (1, 1, 1)),
                                           ("pp=2,dp=4,tp=1", (2, 4, 1)), ("tp=2,pp=3,dp=1", (3, 1, 2))])
def test_parse_mesh_valid(spec, expected):
    mesh = parse_mesh(spec)
    assert (mesh.pp, mesh.dp, mesh.tp) == expected
    assert mesh.world_size == expected[0] * expected[1] * expected[2]


@pytest.mark.parametrize("spec", ["2x2", "0x2x2", "axbxc", "2x2x2x2", "-1x2x2", "pp=2,dp=2", "", "2x2x0"])
def test_parse_mesh_invalid_shows_examples(spec):
    with pytest.raises(ConfigError, match="valid examples: 2x2x2"):
        parse_mesh(spec)


def test_mesh_coords_pp_outermost():
    mesh = MeshSpec(2, 2, 2)
    assert [mesh.coords(r) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert str(mesh) == "2x2x2"


def test_mesh_spec_is_frozen():
    with pytest.raises(Exception):
        MeshSpec(1, 1, 1).pp = 2


def test_yaml_and_flag_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\nmodel: tiny\nlr: 0.01\n")
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    cfg = config_from_args(parser.parse_args(["--config", str(path), "--steps", "9", "--mesh", "pp=2,dp=1,tp=1"]))
    assert (cfg.steps, cfg.model, cfg.lr, cfg.mesh) == (9, "tiny", 0.01, "pp=2,dp=1,tp=1")
    run = resolve(cfg)
    assert run.config.mesh == "2x1x1" and run.config.seq_len == 64 and run.mesh == MeshSpec(2, 1, 1)


@pytest.mark.parametrize("text,match", [("stepz: 3\n", "unknown field"), ("steps: many\n", "steps must be int"),
                                        ("- 1\n- 2\n", "must hold a mapping"), ("a: [\n", "not valid YAML")])
def test_bad_yaml_config(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    with pytest.raises(ConfigError, match=match):
        config_from_args(parser.parse_args(["--config", str(path)]))


@pytest.mark.parametrize("overrides,match", [
    ({"mesh": "1x1x3"}, "n_heads=4 is not divisible by tp=3"),
    ({"mesh": "8x1x1", "schedule": "interleaved-1f1b"}, r"n_layers=8 < pipeline stages = pp\*stages_per_rank = 8\*2 = 16"),
    ({"mesh": "1x2x1", "microbatches": 3}, "global_batch=16 is not divisible by dp\\*microbatches = 2\\*3 = 6"),
    ({"mesh": "4x1x1", "microbatches": 2}, "microbatches=2 < pipeline stages=4"),
    ({"mesh": "2x2x2", "data": "/no/such/file"}, "data: '/no/such/file' does not exist"),
    ({"schedule": "pipedream"}, "unknown 'pipedream'"),
    ({"model": "huge"}, "unknown preset 'huge'"),
    ({"gc_every": -1}, "gc_every: must be >= 0 steps"),
    ({"ffn_dim": 130}, "ffn_dim=130 is not divisible by n_heads=4; set --ffn-dim to a multiple of 4, e.g. 132"),
])
def test_preflight_errors(overrides, match):
    errors = check(Config(**{"model": "tiny", **overrides}))
    assert any(__import__("re").search(match, e) for e in errors), errors


def test_preflight_world_size_and_empty_data(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    errors = check(Config(model="tiny", mesh="2x2x2", data=str(empty)), world_size=4)
    assert any("world size 4 != pp*dp*tp = 2*2*2 = 8" in e for e in errors)
    assert any("holds no text" in e for e in errors)
    assert check(Config(model="tiny", mesh="2x2x2")) == []


@pytest.mark.parametrize("n,s,expected", [
    (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (8, 3, [[0, 1], [2, 3, 4], [5, 6, 7]]),
    (6, 4, [[0], [1, 2], [3, 4], [5]]),
    (10, 4, [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]),
    (4, 4, [[0], [1], [2], [3]]),
    (5, 1, [[0, 1, 2, 3, 4]]),
])
def test_split_layers(n, s, expected):
    assert split_layers(n, s) == expected


@pytest.mark.parametrize("n,s", [(n, s) for n in range(1, 13) for s in range(1, n + 1)])
def test_split_layers_properties(n, s):
    parts = split_layers(n, s)
    sizes = [len(p) for p in parts]
    assert sum(parts, []) == list(range(n))  # contiguous, complete, in order
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert sizes[0] <= max(sizes[1:-1] or sizes) and sizes[-1] <= max(sizes[1:-1] or sizes)


def test_split_layers_rejects_too_few_layers():
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        split_layers(2, 3)


def test_stage_ids_layouts():
    assert stage_ids(1, 4, 1, "single") == [1]
    assert stage_ids(1, 4, 2, "loop") == [1, 5]
    assert stage_ids(0, 2, 2, "v") == [0, 3] and stage_ids(1, 2, 2, "v") == [1, 2]
    for pp, v, layout in [(2, 2, "loop"), (4, 3, "loop"), (3, 2, "v")]:
        held = sorted(s for r in range(pp) for s in stage_ids(r, pp, v, layout))
        assert held == list(range(pp * v))


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_model_shapes_and_param_count(preset):
    args = PRESETS[preset]
    with torch.device("meta"):
        model = build_model(args)
        logits = model(torch.zeros(2, 16, dtype=torch.long, device="meta"))
    assert logits.shape == (2, 16, 256)
    n = sum(p.numel() for p in model.parameters())
    if preset == "small":
        assert 5_000_000 <= n <= 10_000_000, n


def test_seed_model_shapes():
    model = build_model(PRESETS["seed"])
    x, y = seed_batch(0, 1, 8, 32, 10)
    assert model(x).shape == (8, 10) and y.shape == (8,) and loss_fn(model(x), y).ndim == 0


def test_stage_pruning_keeps_fqns():
    with torch.device("meta"):
        full = build_model(PRESETS["tiny"])
        stage = prune_to_stage(build_model(PRESETS["tiny"]), [2, 3], is_first=False, is_last=False)
        hidden = stage(torch.zeros(2, 8, 64, device="meta"))
    names = {n for n, _ in stage.named_parameters()}
    assert names and names <= {n for n, _ in full.named_parameters()}
    assert all(n.startswith(("layers.2.", "layers.3.")) for n in names)
    assert hidden.shape == (2, 8, 64)


@pytest.mark.parametrize("model,mesh,microbatches", [("tiny", "2x2x1", 2), ("small", "4x1x2", 4), ("seed", "2x1x1", 2)])
def test_stage_io_matches_a_meta_forward(model, mesh, microbatches):
    """The static shapes given to PipelineStage are what each stage really takes and returns."""
    run = resolve(Config(mesh=mesh, model=model, microbatches=microbatches))
    cfg, args, pp, dp = run.config, run.model, run.mesh.pp, run.mesh.dp
    layers = split_layers(args.n_layers, pp)
    for s in range(pp):
        inp, out = stage_io(run, s, pp)
        with torch.device("meta"):
            stage = prune_to_stage(build_model(args), layers[s], is_first=s == 0, is_last=s == pp - 1)
            real = stage(inp)
        assert inp.shape[0] == cfg.global_batch // dp // microbatches
        assert real.shape == out.shape and real.dtype == out.dtype, (s, real.shape, out.shape)
        assert out.requires_grad and (inp.requires_grad == (s > 0))


def test_adamw_kernel_flags():
    """Fused AdamW where parameters are all plain or all DTensors; the loop where they mix."""
    plain = [torch.zeros(2, 2), torch.zeros(3)]
    assert kernel_flags(plain) == {"fused": True, "foreach": None}
    script = (
        "import torch, torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.tensor import Replicate, distribute_tensor\n"
        "from train.optim import kernel_flags\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "d = distribute_tensor(torch.zeros(2, 2), init_device_mesh('cpu', (1,)), [Replicate()])\n"
        "print(kernel_flags([d, d]), kernel_flags([d, torch.zeros(3)]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'fused': True, 'foreach': None} {'fused': None, 'foreach': False}"


def test_causality():
    torch.manual_seed(0)
    model = build_model(PRESETS["tiny"])
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 256
    assert torch.equal(model(x)[0, :8], model(y)[0, :8])


def test_batches_pure_and_dp_sharded(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(256)) * 40)
    tokens = load_corpus(str(path))
    train, val = train_val_split(tokens, 0.1)
    assert train.numel() + val.numel() == tokens.numel() == 256 * 40
    x1, y1 = lm_batch(train, seed=3, step=5, batch=8, seq_len=16)
    x2, _ = lm_batch(train, seed=3, step=5, batch=8, seq_len=16)
    x3, _ = lm_batch(train, seed=3, step=6, batch=8, seq_len=16)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert x1.shape == (8, 16) and torch.equal(x1[:, 1:], y1[:, :-1])
    shards = [dp_shard(x1, r, 4) for r in range(4)]
    assert torch.equal(torch.cat(shards), x1) and all(s.shape == (2, 16) for s in shards)


def test_corpus_read_from_files_is_the_loaded_bytes(tmp_path):
    """Batches read their windows from the files (Corpus): the same bytes as the joined corpus, across
    file ends and their separators, an empty file included."""
    for i, n in enumerate([5, 1, 0, 7, 3]):
        (tmp_path / f"f{i}.txt").write_bytes(bytes(range(65, 65 + n)))
    full, lazy = load_corpus(str(tmp_path)), Corpus(str(tmp_path))
    assert lazy.numel() == full.numel() == 20  # 16 bytes, 4 separators
    assert all(lazy.read(a, b) == bytes(full[a:b].tolist()) for a in range(21) for b in range(a, 21))
    for part in (0, 1):
        t, c = train_val_split(full, 0.3)[part], train_val_split(lazy, 0.3)[part]
        assert all(torch.equal(lm_batch(t, 0, s, 4, 3)[0], lm_batch(c, 0, s, 4, 3)[0]) for s in range(1, 20))


def test_default_corpus_is_stdlib_text():
    tokens = load_corpus(None)
    assert tokens.dtype == torch.uint8 and tokens.numel() > 1_000_000
    assert b"def " in bytes(tokens[:200_000].tolist())


def _quoted_corpus() -> tuple[int, str, int, str]:
    """docs/output.md's main job: (its final loss's steps, the data's name, bytes, sha256 prefix)."""
    import re

    doc = (ROOT / "docs" / "output.md").read_text()
    m = re.search(r"final loss +[0-9.]+ after (\d+) steps\n +data +(python-stdlib \(pinned\)), (\d+) bytes, "
                  r"sha256 ([0-9a-f]{12})\n", doc)
    assert m, "docs/output.md no longer quotes the main job's final loss and data lines"
    return int(m[1]), m[2], int(m[3]), m[4]


def test_the_default_corpus_is_pinned_by_content_as_the_docs_name_it():
    from simcluster.train.corpus import STDLIB_MODULES, STDLIB_SHA256, data_identity

    steps, name, size, sha = _quoted_corpus()
    assert steps == Config().steps == 100 and STDLIB_SHA256.startswith(sha)
    assert f"the standard library's {len(STDLIB_MODULES)} top-level modules" in (ROOT / "docs" / "output.md").read_text()
    ident = data_identity(None)  # this host's Python: the pinned modules, pinned or named as another's
    assert ident["files"] == len(STDLIB_MODULES) == 167
    assert ident["name"] == name if ident["sha256_head"] == STDLIB_SHA256 else \
        ident["name"] == f"python-stdlib {sys.version.split()[0]} (not the pinned {STDLIB_SHA256[:12]})"


@pytest.mark.docker
def test_the_trainer_images_standard_library_is_the_pinned_corpus(docker_available):
    """The image's own Python (whatever packages it adds) holds the pinned bytes: the main job's data."""
    from simcluster.launcher.container.layout import IMAGE
    from simcluster.train.corpus import STDLIB_MODULES, STDLIB_SHA256

    _, _, size, _ = _quoted_corpus()
    code = ("import hashlib, os, sys, sysconfig; root = sysconfig.get_paths()['stdlib']; "
            "data = b'\\n'.join(open(os.path.join(root, n + '.py'), 'rb').read() for n in sys.argv[1:]); "
            "print(len(data), hashlib.sha256(data).hexdigest())")
    out = subprocess.run(["docker", "run", "--rm", IMAGE, "python", "-c", code, *STDLIB_MODULES],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(size), STDLIB_SHA256], out.stdout


@pytest.mark.parametrize("flags,message", [
    (["--mesh", "1x1x3"], "n_heads=4 is not divisible by tp=3"),
    (["--mesh", "8x1x1", "--schedule", "interleaved-1f1b"], "n_layers=8 < pipeline stages"),
    (["--mesh", "1x2x1", "--microbatches", "3"], "not divisible by dp*microbatches"),
    (["--mesh", "4x1x1", "--microbatches", "2"], "microbatches=2 < pipeline stages=4"),
    (["--data", "/no/such/file"], "does not exist"),
    (["--mesh", "2x2"], "valid examples: 2x2x2"),
    (["--resume", "/no/such/ckpt"], "no complete checkpoint"),
])
def test_train_cli_bad_config_exits_2_and_writes_nothing(tmp_path, flags, message):
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "train", "--model", "tiny", "--run-dir", str(run_dir), *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not run_dir.exists()


def test_train_cli_world_size_mismatch_exits_2(tmp_path):
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "train", "--model", "tiny", "--mesh", "2x2x2",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "WORLD_SIZE": "4"})
    assert proc.returncode == 2 and "world size 4 != pp*dp*tp = 2*2*2 = 8" in proc.stderr


def test_reference_hands_over_each_step_when_it_ends(tmp_path):
    """train.reference gives each step's record to ``on_step`` as that step ends (its CLI prints the
    step line then, as a mesh's rank 0 does, so bench.dimensions can time steps by their lines):
    when step N's record arrives, the run folder holds N records; in order, the records returned."""
    from simcluster.core.rundir import read_metrics
    from simcluster.train.preflight import preflight
    from simcluster.train.reference import run_reference

    torch.set_num_threads(1)
    seen = []
    records = run_reference(preflight(Config(mesh="1x1x1", model="tiny", steps=3)), str(tmp_path),
                            on_step=lambda rec: seen.append((rec, len(read_metrics(str(tmp_path))))))
    assert [rec for rec, _ in seen] == records and [r["step"] for r in records] == [1, 2, 3]
    assert [n for _, n in seen] == [1, 2, 3]
