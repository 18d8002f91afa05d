"""The full-size plan against torchtitan's published Llama 3.1 runs on H100s and H200s: predicted peak
reserved memory and tokens/s a GPU, the plan's own wall time here, and the one fitted constant.

    python -m bench.fullsize --python /work/venv-fullsize/bin/python --python-2024 /work/venv-tt2024/bin/python --titan-2024 /tmp/tt2024 [--rows 8b-fsdp8,8b-cp4] [--assets DIR] [--reuse]

Each row runs the program its page ran, as published. The December 2024 page's rows (T1-T4) ran
torchtitan at commit 9dec370 (the page's "Versions and Dates"): its ``train.py`` with its own
``train_configs/llama3_8b.toml`` / ``llama3_70b.toml`` and the rows' stated flags, from a checkout
given as --titan-2024 (``git clone https://github.com/pytorch/torchtitan DIR && git -C DIR checkout
9dec370``), under --python-2024 (a venv with ``torch==2.13.0 -r examples/frameworks/torchtitan/
requirements-2024.txt`` and no torchtitan installed: an installed one would shadow the checkout's).
That program repeats K and V to every query head before attention (``repeat_kv``), where 0.2.2
passes ``enable_gqa``: context parallel's ring moves 4x the K/V bytes. The 2025 pages' rows run
torchtitan 0.2.2 (``--module torchtitan.train``) under --python (``python -m venv
--system-site-packages V && V/bin/pip install torch==2.13.0 -r examples/frameworks/torchtitan/
requirements.txt``). The tokenizer of the real vocabulary size, in both formats, and the data are
made locally once (prepare.py --vocab 128256 --tiktoken, about 2 minutes) into --assets.

Each TRACE is one full-size run (rank 0 only: every rank of these layouts is alike), eager and in
bf16; each ROW reads one trace, under the stated models of train/plan/fullsize/variants.py for
torch.compile and Float8 (the full-size run executes neither; the pages of 2025 ran a torchtitan
that compiles its loss too: compile-loss), and is printed against its published figures. Sources:
- "T1".."T4": torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton H100 96 GB at
  500 W; torchtitan's launcher set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and its
  init_distributed set TORCH_NCCL_AVOID_RECORD_STREAMS=1 before the process group (torchtitan
  9dec370, torchtitan/utils.py), so no row is replayed with memory.py's record_streams). Table 1
  row 1 is the only row any constant is set from: MATMUL_EFFICIENCY is solved on it (bisection).
- "async": benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (compile, tokens/s only).
- "H200": benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (torchrun without the allocator
  setting; compile + Float8 with FSDP's Float8 all-gather).
T2 rows 2-4 run context parallelism (torch's ring attention: train/plan/fullsize/ring.py), one rank
standing for all (its load-balanced share of the causal attention is every CP rank's). They are
printed but left out of the issue's check, with the reason (BENCHMARKS.md): only compile + Float8 runs
of them were published, and how the December 2024 compiled ring ran has no stated model here.
Left out, with the reason: T4 row 2 and T5 (AsyncTP's fused matmul-collectives on symmetric memory: no
stated model; T5 also a pipeline schedule, whose bubble the full-size step does not model), T6 (405B on
TP 8 x PP 8 with CP, AsyncTP and 1F1B: the same two reasons), the async page's float8 rowwise rows (no
stated model of rowwise scaling's kernels).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

H100_ENV = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",)
SAC = ("--activation-checkpoint.mode", "selective", "--activation-checkpoint.selective-ac-option", "op")
FULL = ("--activation-checkpoint.mode", "full")
T8B, T70B = ("--job.config_file", "train_configs/llama3_8b.toml"), ("--job.config_file", "train_configs/llama3_70b.toml")
LONG = ("--training.batch_size", "1", "--activation_checkpoint.mode", "full")  # Table 2's rows (the toml's: SAC)
# trace: nodes, GPUs a node, --gpu, env, program ("2024": torchtitan 9dec370's train.py under --python-2024,
# its published toml and flags; "0.2.2": torchtitan.train under --python), that program's flags beyond its COMMON
TRACES = {
    "8b-fsdp8": (1, 8, "h100-96g", H100_ENV, "2024", (*T8B, "--training.batch_size", "2")),
    "8b-fsdp128": (16, 8, "h100-96g", H100_ENV, "2024", (*T8B, "--training.batch_size", "2")),
    "8b-seq32k": (1, 8, "h100-96g", H100_ENV, "2024", (*T8B, *LONG, "--training.seq_len", "32768")),
    **{f"8b-cp{cp}": (1, 8, "h100-96g", H100_ENV, "2024", (*T8B, *LONG, "--training.seq_len", str(32768 * cp),
                                                          "--experimental.context_parallel_degree", str(cp)))
       for cp in (2, 4, 8)},
    "70b-fsdp32-tp8": (32, 8, "h100-96g", H100_ENV, "2024", (*T70B, "--training.batch_size", "16")),  # toml: TP 8, full AC
    "70b-fsdp32-tp8-2025": (32, 8, "h100-96g", H100_ENV, "0.2.2", (
        "--model.flavor", "70B", "--training.local-batch-size", "16", "--parallelism.tensor-parallel-degree", "8", *FULL)),
    "8b-fsdp8-tp8": (8, 8, "h100-96g", H100_ENV, "0.2.2", ("--model.flavor", "8B", "--training.local-batch-size", "12",
                                                           "--parallelism.tensor-parallel-degree", "8", *SAC)),
    "8b-h200-fsdp32": (4, 8, "h200", (), "0.2.2", ("--model.flavor", "8B", "--training.local-batch-size", "2", *SAC)),
    "8b-h200-fsdp64": (8, 8, "h200", (), "0.2.2", ("--model.flavor", "8B", "--training.local-batch-size", "2", *SAC)),
}
# row: trace, techniques (variants.py), published tokens/s a GPU, published GiB (None: not published), source
ROWS = {
    "8b-fsdp8": ("8b-fsdp8", (), 5762, 82.4, "T1 row 1: 8B FSDP 8 (fitted)"),
    "8b-fsdp8-compile": ("8b-fsdp8", ("compile",), 6667, 77.0, "T1 row 2: + compile"),
    "8b-fsdp8-compile-float8": ("8b-fsdp8", ("compile", "float8"), 8532, 76.8, "T1 row 3: + compile + Float8"),
    "8b-seq32k": ("8b-seq32k", ("compile", "float8"), 3890, 83.9, "T2 row 1: 8B FSDP 8, seq 32768, full AC, compile + Float8"),
    "8b-cp2": ("8b-cp2", ("compile", "float8"), 2540, 84.2, "T2 row 2: 8B FSDP 4 x CP 2, seq 65536, full AC, compile + Float8"),
    "8b-cp4": ("8b-cp4", ("compile", "float8"), 1071, 84.0, "T2 row 3: 8B FSDP 2 x CP 4, seq 131072, full AC, compile + Float8"),
    "8b-cp8": ("8b-cp8", ("compile", "float8"), 548, 84.5, "T2 row 4: 8B FSDP 1 x CP 8, seq 262144, full AC, compile + Float8"),
    "8b-fsdp128": ("8b-fsdp128", (), 5605, 67.0, "T3 row 1: 8B FSDP 128"),
    "8b-fsdp128-compile": ("8b-fsdp128", ("compile",), 6514, 62.0, "T3 row 2: + compile"),
    "8b-fsdp128-compile-float8": ("8b-fsdp128", ("compile", "float8"), 8380, 61.8, "T3 row 3: + compile + Float8"),
    "70b-fsdp32-tp8": ("70b-fsdp32-tp8", ("compile", "float8"), 829, 71.9, "T4 row 1: 70B FSDP 32 x TP 8, compile + Float8"),
    "70b-async-bf16": ("70b-fsdp32-tp8-2025", ("compile", "compile-loss"), 597.3, None, "async: 70B FSDP 32 x TP 8, compile, bf16"),
    "70b-async-float8": ("70b-fsdp32-tp8-2025", ("compile", "compile-loss", "float8"), 809.8, None, "async: the same, Float8 tensorwise"),
    "8b-tp8-async-bf16": ("8b-fsdp8-tp8", ("compile", "compile-loss"), 4378, None, "async: 8B FSDP 8 x TP 8, lbs 12, compile, bf16"),
    "8b-tp8-async-float8": ("8b-fsdp8-tp8", ("compile", "compile-loss", "float8"), 5078.1, None, "async: the same, Float8 tensorwise"),
    "8b-h200-4": ("8b-h200-fsdp32", ("compile", "compile-loss", "fsdp-float8"), 10938, 47.96, "H200: 8B FSDP 32, compile + Float8"),
    "8b-h200-8": ("8b-h200-fsdp64", ("compile", "compile-loss", "fsdp-float8"), 10753, 46.97, "H200: 8B FSDP 64, compile + Float8"),
}
COMMON = ("--model.name", "llama3", "--model.hf-assets-path", "assets/tokenizer", "--training.dataset", "c4_test",
          "--training.dataset-path", "data/shakespeare", "--training.seq-len", "8192", "--training.steps", "2",
          "--metrics.log-freq", "1", "--job.dump-folder", "/tmp/simcluster-fullsize-titan")
COMMON_2024 = ("--training.dataset", "c4_test", "--training.steps", "2", "--metrics.log_freq", "1",
               "--job.dump_folder", "/tmp/simcluster-fullsize-titan2024")  # + the assets' tokenizer and data


def prepare(assets: str) -> None:
    """The tokenizer (vocabulary 128256, both formats) and data under assets, made once."""
    if not os.path.exists(os.path.join(assets, "assets", "tokenizer", "tokenizer.model")):
        subprocess.run([sys.executable, "examples/frameworks/torchtitan/prepare.py", "/work/shared/data/tinyshakespeare.txt",
                        assets, "--vocab", "128256", "--tiktoken"], check=True)


def plan(name: str, a: argparse.Namespace, traces: str) -> tuple[dict, float]:
    """The plan's JSON for one trace (rank 0; its trace written under ``traces``) and its wall seconds."""
    nodes, per, gpu, env, program, flags = TRACES[name]
    if program == "2024":
        tokenizer = os.path.join(os.path.abspath(a.assets), "assets", "tokenizer", "tokenizer.model")
        data = os.path.join(os.path.abspath(a.assets), "data", "shakespeare")
        code = ["--script", "train.py", "--code", a.titan_2024, "--python", a.python_2024]
        args = [*COMMON_2024, "--model.tokenizer_path", tokenizer, "--training.dataset_path", data, *flags]
    else:
        code = ["--module", "torchtitan.train", "--code", a.assets, "--python", a.python]
        args = [*COMMON, *flags, "--parallelism.data-parallel-shard-degree",
                str(nodes * per // _degree(flags, "tensor") // _degree(flags, "context"))]
    cmd = [sys.executable, "-m", "launcher", "plan", "--full-size", *code, "--nodes", str(nodes), "--nproc-per-node",
           str(per), "--gpu", gpu, *[x for e in env for x in ("--env", e)], "--ranks", "0", "--trace-dir", traces,
           "--json", "--", *args]
    start = time.monotonic()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out), time.monotonic() - start


def _degree(flags: tuple, kind: str) -> int:
    """The ``kind`` ("tensor", "context") parallel degree among torchtitan's flags (1 when none)."""
    flag = f"--parallelism.{kind}-parallel-degree"
    return int(flags[flags.index(flag) + 1]) if flag in flags else 1


def fit(trace_path: str, target_tps: float) -> float:
    """The matmul efficiency at which the trace's predicted tokens/s is target_tps (bisection)."""
    from simcluster.train.plan.fullsize.device import constants
    from simcluster.train.plan.fullsize.speed import speed
    from simcluster.train.plan.fullsize.trace import read

    trace, device = read(trace_path), constants("h100-96g")
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if speed(trace, device, mid).tokens_per_s < target_tps:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def row_line(row: str, data: dict, wall: float, trace_path: str) -> str:
    """One row: predicted against published; memory and speed of the trace under the row's techniques."""
    from simcluster.train.plan.fullsize.device import constants
    from simcluster.train.plan.fullsize.memory import replay
    from simcluster.train.plan.fullsize.speed import speed
    from simcluster.train.plan.fullsize.trace import read
    from simcluster.train.plan.fullsize.variants import apply

    name, techniques, tps, gib, label = ROWS[row]
    _, _, gpu, env, _, _ = TRACES[name]
    trace, device = apply(read(trace_path), techniques), constants(gpu)
    m, s = replay(trace, device, any("expandable_segments:True" in e for e in env)), speed(trace, device)
    got = m.peak_reserved / 2**30
    mem = f"reserved {got:.1f} GiB" + (f" (published {gib}, {got / gib - 1:+.1%})" if gib else " (none published)")
    return (f"{row} [{label}; {'+'.join(techniques) or 'eager'}]: {mem}, allocated {m.peak_allocated / 2**30:.1f} GiB, "
            f"{s.tokens_per_s:,.0f} tokens/s a GPU (published {tps:,}, {s.tokens_per_s / tps - 1:+.1%}), step "
            f"{s.step_s:.3f} s, {'fits' if m.fits else 'OOM'} (published: fits); plan {wall:.0f} s here (rank run "
            f"{data['ranks'][0]['seconds_here']:.0f} s), load {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="an interpreter with torchtitan 0.2.2")
    ap.add_argument("--python-2024", help="an interpreter with torch 2.13 and examples/frameworks/torchtitan/"
                    "requirements-2024.txt, without torchtitan installed (the 2024 rows)")
    ap.add_argument("--titan-2024", help="a checkout of torchtitan at commit 9dec370 (the 2024 rows)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--assets", default="/tmp/simcluster-fullsize-assets", help="tokenizer and data (made once)")
    ap.add_argument("--reuse", action="store_true", help="read the traces a previous run left under --assets (no plan run)")
    a = ap.parse_args()
    rows = a.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"--rows: unknown {', '.join(unknown)}; e.g. --rows 8b-fsdp8,70b-fsdp32-tp8")
    old = sorted({r for r in rows if TRACES[ROWS[r][0]][4] == "2024"})
    if old and not a.reuse and not (a.python_2024 and a.titan_2024 and os.path.isfile(os.path.join(a.titan_2024, "train.py"))):
        ap.error(f"rows {', '.join(old)} run torchtitan of December 2024: give --titan-2024 DIR (git clone "
                 "https://github.com/pytorch/torchtitan DIR && git -C DIR checkout 9dec370) and --python-2024 EXE "
                 "(a venv: pip install torch==2.13.0 -r examples/frameworks/torchtitan/requirements-2024.txt), or "
                 "--rows of the 2025 pages only, e.g. --rows 8b-h200-4")
    prepare(a.assets)
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    done: dict[str, tuple[dict, float]] = {}
    for row in rows:
        name = ROWS[row][0]
        traces = os.path.join(a.assets, "traces", name)
        if name not in done and a.reuse:
            with open(os.path.join(traces, "trace-0.json")) as f:
                done[name] = {"ranks": [{"seconds_here": json.load(f)["seconds"]}]}, 0.0
        elif name not in done:
            done[name] = plan(name, a, traces)
        print(row_line(row, *done[name], os.path.join(traces, "trace-0.json")), flush=True)
        if row == "8b-fsdp8":
            print(f"  fitted MATMUL_EFFICIENCY on this row: {fit(os.path.join(traces, 'trace-0.json'), ROWS[row][2]):.4f}")


if __name__ == "__main__":
    main()
