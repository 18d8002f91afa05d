"""`launcher plan --full-size`: the caching-allocator model on known sequences, and one small full-size
run of a GPU script (2 fake ranks, seconds) whose recorded sizes, FLOPs and collectives are checked
against what the script's shapes give, and whose JSON carries every field.

    python -m pytest -q -n 0 tests/test_fullsize.py
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.train.plan.fullsize.allocator import Allocator, OutOfMemory, allocation_size, round_size

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def test_allocator_rounding_and_segment_sizes():
    """512-byte rounding; 2 MiB small segments, 20 MiB for a large request under 10 MiB, else 2 MiB steps."""
    assert [round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    assert allocation_size(1000) == 2 * MiB and allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB and allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB and allocation_size(11 * MiB + 1) == 12 * MiB


def test_allocator_pools_split_merge_and_reuse():
    """Small requests share a 2 MiB segment; a 5 MiB request splits a 20 MiB segment and the next
    reuses it; a remainder of at most 1 MiB is not split off; freed neighbours merge; no cross-pool reuse."""
    a = Allocator()
    s1, s2 = a.malloc(1000), a.malloc(1000)
    assert (a.reserved, a.allocated, a.mallocs) == (2 * MiB, 2048, 1)
    b1, b2 = a.malloc(5 * MiB), a.malloc(5 * MiB)
    assert (a.reserved, a.mallocs) == (22 * MiB, 2) and b1.seg == b2.seg and b2.offset == 5 * MiB
    a.free(b1), a.free(b2)
    assert a.allocated == 2048
    whole = a.malloc(20 * MiB)  # the merged 20 MiB block, no new segment
    assert (a.reserved, a.mallocs, whole.offset) == (22 * MiB, 2, 0)
    a.free(whole), a.free(s1), a.free(s2)
    small = a.malloc(100)  # the small pool's own segment, not the free 20 MiB one
    assert small.small and a.reserved == 22 * MiB and a.mallocs == 2
    big = a.malloc(19 * MiB + 512 * 1023)  # 20 MiB - 512 B: remainder 512 B <= 1 MiB, not split
    assert big.size == 20 * MiB and a.allocated == 512 + 20 * MiB and a.peak_reserved == 22 * MiB


def test_allocator_capacity_releases_cached_segments_then_oom():
    """Past the capacity, cached free segments are released (a retry) before an OOM is declared."""
    a = Allocator(capacity=40 * MiB)
    x = a.malloc(30 * MiB)
    a.free(x)
    y = a.malloc(32 * MiB)  # 30 MiB cached + 32 MiB > 40: the cached segment goes first
    assert (a.retries, a.reserved) == (1, 32 * MiB)
    with pytest.raises(OutOfMemory) as e:
        a.malloc(10 * MiB)
    assert e.value.needed == 10 * MiB and e.value.reserved == 32 * MiB
    a.free(y)


def test_allocator_expandable_segments_grow_by_pages():
    """expandable_segments: one segment a pool grows by 20 MiB pages; a freed end block grows in place."""
    a = Allocator(expandable=True)
    x = a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB
    y = a.malloc(30 * MiB)  # 5 + 30 = 35 MiB -> 40 MiB mapped
    assert a.reserved == 40 * MiB and y.offset == 5 * MiB
    a.free(y)
    z = a.malloc(50 * MiB)  # the free end block (from 5 MiB) grows: 55 MiB -> 60 MiB mapped
    assert (a.reserved, z.offset) == (60 * MiB, 5 * MiB)
    a.free(x), a.free(z)
    assert a.allocated == 0 and a.peak_reserved == 60 * MiB


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """examples/fullsize/tiny.py (FSDP2 on cuda/nccl) on 2 fake ranks, 2 steps, through the CLI."""
    d = tmp_path_factory.mktemp("fullsize")
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", "--script", "examples/fullsize/tiny.py",
           "--nodes", "1", "--nproc-per-node", "2", "--gpu", "h100-96g", "--trace-dir", str(d), "--json", "--",
           "--steps", "2", "--print-loss"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout), d


def test_tiny_run_records_the_scripts_own_sizes(tiny_run):
    """Per step: one all-gather of each layer's fp32 parameters (2*1024*4096 + 4096 + 1024 of them),
    the matmul FLOPs of 6 x tokens x weights (less the input's gradient) are what the trace holds; the
    replay's allocated bytes at the end equal the trace's live storages, each rounded to 512 B."""
    from simcluster.train.plan.fullsize.device import CUBLAS_WORKSPACE, constants
    from simcluster.train.plan.fullsize.memory import replay
    from simcluster.train.plan.fullsize.record import live_bytes
    from simcluster.train.plan.fullsize.speed import speed, step_of
    from simcluster.train.plan.fullsize.trace import read

    _, d = tiny_run
    t = read(str(d / "trace-0.json"))
    assert (t.steps, t.world_size, t.error) == (2, 2, None)
    layer = 2 * 1024 * 4096 + 4096 + 1024
    gathers = [e for e in t.events if e[0] == "c" and e[1] == "allgather_base" and step_of(t.phases[e[5]]) == 2]
    assert {e[2] for e in gathers} == {layer * 4} and len(gathers) == 8 and {tuple(e[4]) for e in gathers} == {(0, 1)}
    s = speed(t, constants("h100-96g"))
    tokens, weights = 8 * 256, 4 * 2 * 1024 * 4096
    # forward 2, backward 4 FLOPs a weight and token; the first Linear's input needs no gradient (2 fewer)
    assert s.flops == 6 * tokens * weights - 2 * tokens * 1024 * 4096
    sizes: dict[int, int] = {}
    blocks: dict[int, object] = {}
    a = Allocator()
    for e in t.events:  # the allocator's allocated bytes follow the trace's live storages
        if e[0] in ("f", "r") and e[1] in blocks:
            a.free(blocks.pop(e[1]))
            sizes.pop(e[1], None)
        if e[0] in ("a", "r") and e[2]:
            blocks[e[1]], sizes[e[1]] = a.malloc(e[2], e[4]), e[2]
        if e[0] in ("a", "f", "r"):  # a block keeps an unsplit remainder of at most 1 MiB (large pool)
            assert a.allocated == sum(b.size for b in blocks.values())
            assert all(0 <= blocks[k].size - round_size(n) <= MiB for k, n in sizes.items())
    assert live_bytes(t.events) == sum(sizes.values())
    streams = {e[4] for e in t.events if e[0] == "a" and e[2] == layer * 4}  # a layer's flat fp32 buffers:
    assert streams == {0, 1}  # reduce-scatter inputs on the default stream, all-gather outputs on FSDP's copy-in one
    m = replay(t, constants("h100-96g"))
    assert m.peak_allocated == a.peak_allocated + CUBLAS_WORKSPACE
    shard = 4 * layer // 2 * 4  # a rank's fp32 parameters: 4 layers over 2 ranks
    assert m.peak_allocated > 4 * shard  # parameters, gradients and AdamW's two states at the optimizer step


def test_tiny_run_json_and_placeholders(tiny_run):
    """The JSON's ranks carry every field; the loss print is named as answered with a placeholder."""
    data, _ = tiny_run
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["gpu"] == "h100-96g"
    for r in data["ranks"]:
        assert {"rank", "peak_allocated_gib", "peak_reserved_gib", "phase", "fits", "step_s", "tokens_per_s"} <= set(r)
        assert 0 < r["peak_allocated_gib"] <= r["peak_reserved_gib"] < 2 and r["fits"] is True and r["step_s"] > 0
        assert r["phase"].startswith("step ")
    src = (ROOT / "examples/fullsize/tiny.py").read_text().splitlines()
    at = next(i for i, line in enumerate(src, 1) if "loss.item()" in line)
    assert any(f"tiny.py:{at} " in line and "loss.item()" in line for line in data["placeholders"])
    assert any("size unknown" in u for u in data["unseen"])


def test_full_size_bad_input_exits_2(tmp_path):
    """A --gpu model without a device's constants, and no program, exit 2 naming the fix."""
    base = [sys.executable, "-m", "launcher", "plan", "--full-size", "--nodes", "1", "--nproc-per-node", "2"]
    p = subprocess.run([*base, "--script", "examples/fullsize/tiny.py", "--gpu", "local"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "bf16_flops" in p.stderr and "--gpu h100-96g" in p.stderr
    p = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--script FILE or --module NAME" in p.stderr
    p = subprocess.run([*base[:4], "--mesh", "2x1x1", "--ranks", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)  # a full-size flag on the shapes' plan: refused, not ignored
    assert p.returncode == 2 and "--ranks read by --full-size only" in p.stderr
    p = subprocess.run([*base, "--script", "examples/fullsize/tiny.py", "--knob", "batch=1,2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--search needs --knob NAME=V1,V2" in p.stderr


def test_a_checkpoint_save_is_refused_naming_the_line(tmp_path):
    """A program that saves its fake tensors: exit 2 naming its own line and the switch to skip it;
    nothing written."""
    out = tmp_path / "model.pt"
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", "--script", "examples/fullsize/tiny.py",
           "--nodes", "1", "--nproc-per-node", "2", "--ranks", "0", "--", "--steps", "1", "--dim", "256", "--layers",
           "1", "--save", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    src = (ROOT / "examples/fullsize/tiny.py").read_text().splitlines()
    at = next(i for i, line in enumerate(src, 1) if "torch.save(" in line)
    assert p.returncode == 2 and f"examples/fullsize/tiny.py\", line {at}" in p.stderr, p.stderr[-2000:]
    assert "torch.save of tensors without data" in p.stderr and "switch" in p.stderr and not out.exists()


def test_search_names_the_largest_batch_that_fits():
    """--search --knob over the script's own --batch: 512 sequences of 8,192 tokens OOM on h100-96g,
    at a phase of the model, by a named amount; 1 fits and is the largest that does."""
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", "--search", "--knob", "batch=1,512", "--script",
           "examples/fullsize/tiny.py", "--nodes", "1", "--nproc-per-node", "2", "--ranks", "0", "--gpu", "h100-96g",
           "--json", "--", "--steps", "1", "--layers", "2", "--seq", "8192"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    assert [c["fits"] for c in data["candidates"]] == [True, False] and data["largest_fitting"] == "1"
    oom = data["candidates"][1]
    assert oom["oom_by_gib"] > 0 and "FSDPSequential" in oom["plan"]["ranks"][0]["phase"]


def _trace(events, phases):
    from simcluster.train.plan.fullsize.trace import Trace
    return Trace(0, 8, 0.0, 1, tuple(phases), tuple(events), {}, None)


def test_functional_collectives_are_exposed_fsdp_ones_overlapped():
    """A DTensor (functional) all-gather adds to the compute; FSDP's c10d all-gather of the same bytes
    hides behind it (only the step's first overlapped collective is exposed)."""
    from simcluster.train.plan.fullsize.device import constants
    from simcluster.train.plan.fullsize.speed import collective_s, op_s, speed

    hw = constants("h100-96g")
    ph = ["step 1, microbatch 1, forward m.layers.0.attention.wq"]
    op = ("op", 10**12, 0, 0, 0, "mm")
    c = collective_s("all_gather_into_tensor", 1 << 30, tuple(range(8)), hw)
    fsdp = speed(_trace([op, ("c", "allgather_base", 1 << 30, 8, tuple(range(8)), 0), op], ph), hw)
    tp = speed(_trace([op, ("c", "all_gather_into_tensor", 1 << 30, 8, tuple(range(8)), 0), op], ph), hw)
    assert fsdp.step_s == pytest.approx(2 * op_s(10**12, 0, False, hw) + c)  # the first collective: exposed
    assert tp.step_s == pytest.approx(2 * op_s(10**12, 0, False, hw) + c) and tp.comm_s == pytest.approx(c)
    two = speed(_trace([("c", "allgather_base", 8, 8, tuple(range(8)), 0), op,
                        ("c", "all_gather_into_tensor", 1 << 30, 8, tuple(range(8)), 0), op], ph), hw)
    assert two.step_s > tp.step_s  # the functional one is not hidden behind the compute


def test_record_streams_hold_a_collectives_tensors_for_the_launch_queue():
    """With record_stream, a freed input of an async collective is reused only LAUNCH_QUEUE ops later."""
    from simcluster.train.plan.fullsize.device import LAUNCH_QUEUE, constants
    from simcluster.train.plan.fullsize.memory import replay

    hw = constants("h100-96g")
    big = 64 * MiB
    ev = [("a", 0, big, 0, 0), ("c", "reduce_scatter_tensor", big, 8, tuple(range(8)), 0, (0,)), ("f", 0, 0),
          ("a", 1, big, 0, 0), ("f", 1, 0)]
    plain, held = replay(_trace(ev, ["p"]), hw), replay(_trace(ev, ["p"]), hw, record_streams=True)
    assert held.peak_allocated - plain.peak_allocated == big
    later = ev[:3] + [("op", 0, 1, 0, 0, "add")] * LAUNCH_QUEUE + ev[3:]
    assert replay(_trace(later, ["p"]), hw, record_streams=True).peak_allocated == plain.peak_allocated


def test_variants_float8_and_compile_rules():
    """Float8: a block's matmul at half its bf16 time plus a cast of 2.5x its bytes, the output layer's
    unchanged; compile: consecutive memory-bound ops of one block fuse into the largest one's bytes."""
    from simcluster.train.plan.fullsize.variants import apply

    ph = ["step 1, microbatch 1, forward m.layers.3.feed_forward.w1", "step 1, microbatch 1, forward m.output"]
    ev = [("op", 0, 100, 0, 0, "mul"), ("op", 0, 300, 0, 0, "add"), ("op", 1000, 40, 0, 0, "mm"),
          ("op", 1000, 40, 1, 0, "mm"), ("op", 0, 50, 0, 0, "silu")]
    f8 = apply(_trace(ev, ph), ("float8",)).events
    assert f8[2] == ("op", 0, 100, 0, 0, "float8_cast") and f8[3][1] == 500 and f8[4] == ev[3]
    both = apply(_trace(ev, ph), ("compile", "float8")).events
    assert [(e[1], e[2], e[5]) for e in both] == [(0, 300, "fused"), (500, 40, "mm_float8"), (1000, 40, "mm"),
                                                  (0, 50, "fused")]
    with pytest.raises(ValueError, match="fp16"):
        apply(_trace(ev, ph), ("fp16",))


def test_compiled_loss_drops_the_float32_copies_of_the_logits():
    """compile-loss: the loss phase's allocations of twice the output layer's largest (bf16 logits)
    output go, with their frees; the bf16 gradient of the same size as the logits stays."""
    from simcluster.train.plan.fullsize.variants import apply

    ph = ["step 1, microbatch 1, forward M.output", "step 1, outside the model, after the forward of M"]
    ev = [("a", 0, 400, 0, 0), ("a", 1, 800, 1, 0), ("a", 2, 800, 1, 0), ("f", 1, 1), ("a", 3, 400, 1, 0), ("f", 2, 1)]
    assert apply(_trace(ev, ph), ("compile-loss",)).events == (ev[0], ev[4])


def test_prepare_writes_the_2024_trainers_tiktoken_file(tmp_path):
    """prepare.py --tiktoken (the tokenizer torchtitan 9dec370 loads): vocab - 256 ranks, one a line in
    order, the 256 bytes first, then the tokens of tokenizer.json as bytes, then distinct fillers; each
    rank's bytes distinct (tiktoken refuses a repeated token)."""
    import base64
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare", ROOT / "examples/frameworks/torchtitan/prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat, the cat ate the rat.\n" * 50)
    subprocess.run([sys.executable, "examples/frameworks/torchtitan/prepare.py", str(corpus), str(tmp_path / "out"),
                    "--vocab", "4096", "--tiktoken"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    lines = (tmp_path / "out/assets/tokenizer/tokenizer.model").read_text().splitlines()
    ranks = [(base64.b64decode(line.split()[0]), int(line.split()[1])) for line in lines]
    assert [r for _, r in ranks] == list(range(4096 - 256)) and len({t for t, _ in ranks}) == len(ranks)
    assert [t for t, _ in ranks[:256]] == [bytes([b]) for b in range(256)]
    vocab = json.loads((tmp_path / "out/assets/tokenizer/tokenizer.json").read_text())["model"]["vocab"]
    to_byte = {c: b for b, c in prepare.byte_symbols().items()}
    learnt = sorted(vocab, key=vocab.get)
    assert [t for t, _ in ranks[:len(learnt)]] == [bytes(to_byte[c] for c in tok) for tok in learnt]
    assert all(t[:1] == b"\0" and len(t) == 4 for t, _ in ranks[len(learnt):])
