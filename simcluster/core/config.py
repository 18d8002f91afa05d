"""Run configuration: the mesh spec, the model presets and every training option.

Torch-free on purpose, so the launcher can parse and preflight a run on a host without torch.

    python -m train --config run.yaml --mesh 2x2x2 --steps 50   # how a Config is made
    python -c "from simcluster.core.config import parse_mesh; print(parse_mesh('2x2x2'))"
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from simcluster.core.errors import ConfigError
from simcluster.core.layout import node_of

DEVICES = ("cpu", "cuda")  # --device: gloo on CPU, or nccl with one GPU per rank
MESH_EXAMPLES = "valid examples: 2x2x2, 4x1x2, 1x1x1, pp=2,dp=2,tp=2"

# schedule name -> (torch.distributed.pipelining class name, stage layout)
# layout: "single" = one stage per rank, "loop" = v stages per rank placed round-robin,
# "v" = exactly two stages per rank in a V (rank r holds stages r and 2*pp-1-r).
SCHEDULES: dict[str, tuple[str, str]] = {
    "gpipe": ("ScheduleGPipe", "single"),
    "1f1b": ("Schedule1F1B", "single"),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "looped-bfs": ("ScheduleLoopedBFS", "loop"),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv": ("ScheduleZBVZeroBubble", "v"),
    "dualpipev": ("ScheduleDualPipeV", "v"),
}


@dataclass(frozen=True)
class MeshSpec:
    """A 3D device mesh shape, dims ordered (pp, dp, tp): pp outermost, tp innermost.

    Rank r sits at pp = r // (dp*tp), dp = (r // tp) % dp, tp = r % tp, so one node
    (pipeline stage group) holds dp*tp consecutive ranks.
    """

    pp: int = 1
    dp: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def ranks_per_node(self) -> int:
        """Ranks of one pipeline-stage group (= one simulated node)."""
        return self.dp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) coordinates of a global rank."""
        return node_of(rank, self.ranks_per_node), (rank // self.tp) % self.dp, rank % self.tp

    def __str__(self) -> str:
        return f"{self.pp}x{self.dp}x{self.tp}"


def parse_mesh(spec: str) -> MeshSpec:
    """Parse ``PPxDPxTP`` (``2x2x2``) or ``pp=2,dp=2,tp=2`` into a MeshSpec.

    Raises:
        ConfigError: anything else (``2x2``, ``0x2x2``, ``axbxc``), with valid examples.
    """
    text = str(spec).strip().lower()
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
    if m:
        values = dict(zip(("pp", "dp", "tp"), map(int, m.groups())))
    else:
        parts = dict(p.split("=", 1) for p in text.split(",") if p.count("=") == 1)
        if set(parts) != {"pp", "dp", "tp"} or len(text.split(",")) != 3 or not all(
            re.fullmatch(r"\d+", v.strip()) for v in parts.values()
        ):
            raise ConfigError(f"mesh: cannot parse {spec!r}; expected PPxDPxTP or pp=N,dp=N,tp=N ({MESH_EXAMPLES})")
        values = {k: int(v) for k, v in parts.items()}
    bad = [k for k, v in values.items() if v < 1]
    if bad:
        raise ConfigError(f"mesh: {', '.join(bad)} must be >= 1 in {spec!r} ({MESH_EXAMPLES})")
    return MeshSpec(**values)


@dataclass(frozen=True)
class ModelArgs:
    """Shape of the decoder (or of the ``seed`` MLP stack when ``kind == "seed"``)."""

    kind: str = "llama"  # "llama": decoder LM; "seed": the toy Linear stack on synthetic data
    dim: int = 64
    n_layers: int = 8
    n_heads: int = 4
    ffn_dim: int = 128
    vocab_size: int = 256  # byte-level tokens; for "seed": number of classes (10)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


PRESETS: dict[str, ModelArgs] = {
    # tests: well under a second a step on one core
    "tiny": ModelArgs(dim=64, n_layers=8, n_heads=4, ffn_dim=128),
    # the default job: 6.4 M parameters
    "small": ModelArgs(dim=256, n_layers=8, n_heads=8, ffn_dim=704),
    # the original toy script: blocks of 32->32->32 and 32->64->32 with residuals, a 32->10 head
    "seed": ModelArgs(kind="seed", dim=32, n_layers=4, n_heads=1, ffn_dim=64, vocab_size=10),
}

# per-preset defaults for the data shape, applied unless the user sets the field
PRESET_DATA = {"tiny": {"seq_len": 64, "global_batch": 16}, "small": {"seq_len": 256, "global_batch": 16},
               "seed": {"seq_len": 1, "global_batch": 32}}


@dataclass(frozen=True)
class Config:
    """Every option of a run as the user gave it. YAML keys and ``--flag`` names are these field
    names (``--flag-name`` for ``flag_name``); the docstring after each field documents it.
    Derived facts (the parsed mesh, model shape, microbatches, stages) live in ``TrainRun``,
    made once by ``resolve`` (through ``train.preflight.preflight``)."""

    mesh: str = "1x1x1"
    """pp x dp x tp, e.g. 2x2x2 or pp=2,dp=2,tp=2; world size must equal pp*dp*tp."""
    model: str = "small"
    """preset: tiny | small | seed."""
    dim: int | None = None
    """model width (overrides the preset)."""
    n_layers: int | None = None
    """number of transformer blocks (overrides the preset)."""
    n_heads: int | None = None
    """attention heads (overrides the preset); must be divisible by tp."""
    ffn_dim: int | None = None
    """SwiGLU hidden size (overrides the preset); must be divisible by tp."""
    seq_len: int | None = None
    """tokens per sequence (preset default: tiny 64, small 256)."""
    global_batch: int | None = None
    """sequences per optimizer step over all dp ranks (preset default 16)."""
    microbatches: int = 0
    """pipeline microbatches per dp rank and step; 0 = the fewest the schedule takes (pp * stages per rank), fastest on shared CPU cores."""
    schedule: str = "1f1b"
    """pipeline schedule: gpipe | 1f1b | interleaved-1f1b | looped-bfs | interleaved-zb | zbv | dualpipev."""
    stages_per_rank: int = 2
    """virtual stages per pp rank for interleaved-1f1b, looped-bfs, interleaved-zb (zbv/dualpipev use 2)."""
    steps: int = 100
    """optimizer steps (the default job: about 4 minutes for the small model on 2x2x2 here)."""
    lr: float = 3e-3
    """peak AdamW learning rate."""
    min_lr: float = 3e-4
    """learning rate at the end of the cosine decay."""
    warmup_steps: int = 20
    """linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    max_norm: float = 1.0
    """clip gradients to this global L2 norm (0 disables clipping)."""
    seed: int = 0
    """seed for parameters and data; the same seed gives the same run on every mesh."""
    data: str | None = None
    """UTF-8 text file or folder of them; default: the running Python's standard library sources."""
    val_fraction: float = 0.05
    """fraction of the corpus (its tail) held out for validation."""
    val_every: int = 50
    """validation loss every N steps (0: never)."""
    val_batches: int = 2
    """global batches per validation."""
    log_every: int = 1
    """log line every N steps (metrics.jsonl gets every step)."""
    run_dir: str | None = None
    """folder for config.yaml, metrics.jsonl and checkpoints (default: runs/mesh-PPxDPxTP, see default_run_dir)."""
    timeout_s: float = 60.0
    """process-group and pipeline timeout (s): a lost, frozen or cut-off peer ends the job after this."""
    stall_s: float | None = None
    """default 60 (off when --timeout-s is shorter, which ends a hang first). A hang: a rank waits in a collective or a send/recv and no rank completes a call or a step (or compiles) for this long (s), counted from every rank's first completed call: each rank's stack and communication record are collected, RUN_DIR/hang.json names where they disagree, the job exits 4. Every rank outside communication that long (compiling, loading, saving, sleeping) is no hang: a note says what each does (0: off; else at least 5 s, the watch's resolution with room; the process-group timeout becomes at least stall_s + 30 s, above --timeout-s too, so that the diagnosis comes first). docs/faults.md."""
    threads: int = 0
    """torch intra-op threads per rank (0: OMP_NUM_THREADS or 1)."""
    gc_every: int = 50
    """Python garbage collection every N steps instead of automatically, as torchtitan's gc_freq (0: automatic)."""
    ckpt_every: int = 0
    """save a DCP checkpoint into RUN_DIR/checkpoints every N steps and after the last step (0: never)."""
    ckpt_keep: int = 2
    """checkpoints to keep (the newest; 0 keeps all)."""
    resume: str | None = None
    """checkpoint folder, or a folder of them (the newest is taken), to resume from; any mesh. "auto": the newest complete checkpoint of RUN_DIR/checkpoints, or a fresh start when there is none (what torchrun restarts need); the keyword wins, so write a folder named auto as ./auto. Shape, seq_len, global_batch, seed and data must match the checkpoint; lr, min_lr, warmup_steps, steps, weight_decay and max_norm may change (announced)."""
    profile_step: int = 0
    """profile this step (0: off): the same as --trace-steps N (RUN_DIR/trace.json and each rank's time breakdown in RUN_DIR/profile/rank-R.json)."""
    trace_steps: str | None = None
    """steps to trace, e.g. 3,4 or 3-5: RUN_DIR/trace.json, one Chrome/Perfetto trace of every rank (one process per node, one track per rank), each rank's time breakdown in RUN_DIR/profile/, and the measured pipeline bubble."""
    traffic: int = 0
    """1: count the bytes and messages of every communication per step and rank, by kind and node link, into RUN_DIR/traffic/rank-R.jsonl and a "traffic" key of metrics.jsonl."""
    check_collectives: int = 0
    """1: torch's TORCH_DISTRIBUTED_DEBUG=DETAIL in every rank: each collective's op, shapes and dtypes checked across its group before it runs, so a mismatch (which gloo answers with an abort or garbage) is named on both sides at once (cost: BENCHMARKS.md, bench/stallwatch.py)."""
    device: str = "cpu"
    """cpu | cuda. cuda: the nccl backend, the device mesh on cuda, rank on GPU LOCAL_RANK (see train/device.py)."""
    rank_metrics: int = 0
    """1: every rank also writes RUN_DIR/ranks/rank-R.jsonl (input checksum, local losses, grad norm), bit-exact."""
    memory_probe: int = 0
    """1: every rank writes RUN_DIR/memory/rank-R.jsonl, its PSS, USS, threads and sockets at each milestone (train/memprobe.py)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_steps(text: str | None, steps: int) -> tuple[int, ...]:
    """``"3,4"`` or ``"3-5"`` (or both, ``"2,4-5"``) -> sorted step numbers; None or "" -> ().

    Raises:
        ConfigError: step_spans' refusals.
    """
    return tuple(step for lo, hi in step_spans(text, steps) for step in range(lo, hi + 1))


def step_spans(text: str | None, steps: int) -> tuple[tuple[int, int], ...]:
    """``"2,4-5"`` -> its parts' (first, last) steps, sorted; None or "" -> (). Checked without building a
    list of steps (a check of ``1-1000000000`` costs what ``1`` does).

    Raises:
        ConfigError: text that does not parse, a range that runs backwards (``5-3``), a step given twice (``3,3``,
            ``3,2-4``), or a step outside 1..steps, naming trace_steps and a fix.
    """
    if not text or not str(text).strip():
        return ()
    spans: list[tuple[int, int]] = []
    for part in str(text).replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ConfigError(f"trace_steps: cannot parse {part!r} in {text!r}; write steps as 3,4 or 3-5")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ConfigError(f"trace_steps: {part!r} in {text!r} runs backwards; write steps as 3,4 or 3-5")
        spans.append((lo, hi))
    spans.sort()
    for (_, reach), (lo, _) in zip(spans, spans[1:]):  # by first step: one that starts within the last repeats it
        if lo <= reach:
            raise ConfigError(f"trace_steps: step {lo} given twice in {text!r}; e.g. 3,4 or 3-5")
    bad = [(a, b) for lo, hi in spans for a, b in ((lo, min(hi, 0)), (max(lo, steps + 1), hi)) if a <= b]
    if bad:
        raise ConfigError(f"trace_steps: step(s) {', '.join(str(a) if a == b else f'{a}-{b}' for a, b in bad)} outside "
                          f"the run (steps 1..{steps}); pick steps within it, e.g. --trace-steps {min(3, steps)}")
    return tuple(spans)


def traced_steps(cfg: "Config") -> tuple[int, ...]:
    """The steps a run traces: --trace-steps and --profile-step together, in order (parse_steps' errors)."""
    return tuple(sorted(set(parse_steps(cfg.trace_steps, cfg.steps)) | ({cfg.profile_step} if cfg.profile_step else set())))


def default_run_dir(mesh: MeshSpec) -> str:
    """The one default run folder of a mesh, for every entry point (``python -m train``, torchrun,
    ``launcher generate`` and ``launcher up``): ``runs/mesh-PPxDPxTP``. An explicit run_dir wins."""
    return f"runs/mesh-{mesh}"


@dataclass(frozen=True)
class TrainRun:
    """A run resolved once from a Config: what every rank and the launcher read, never re-derived.

    config: the user's options with the preset's data defaults (seq_len, global_batch), the
        default microbatches, the normalised mesh text and the run folder filled in
        (what RUN_DIR/config.yaml holds).
    mesh: the parsed (pp, dp, tp) mesh.
    model: the model shape: the preset with --dim/--n-layers/--n-heads/--ffn-dim applied.
    layout: stage placement of the schedule: "single", "loop" (round-robin) or "v".
    local_stages: pipeline stages held by each pp rank.
    resume_path: the checkpoint folder (step-NNNNNN) to load, checked by preflight; None: fresh start.
    resume_notes: what preflight found changed against that checkpoint (hyperparameters, versions),
        one line each, for rank 0 to announce.
    """

    config: Config
    mesh: MeshSpec
    model: ModelArgs
    layout: str
    local_stages: int
    resume_path: str | None = None
    resume_notes: tuple[str, ...] = ()

    @property
    def n_stages(self) -> int:
        """Pipeline stages in all: pp x local_stages."""
        return self.mesh.pp * self.local_stages

    @property
    def microbatch_size(self) -> int:
        """Sequences per microbatch on one dp rank: global_batch / dp / microbatches."""
        return self.config.global_batch // self.mesh.dp // self.config.microbatches

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one global batch (samples for the seed model, which has no sequence)."""
        return self.config.global_batch * (self.config.seq_len if self.model.kind == "llama" else 1)


def resolve(cfg: Config) -> TrainRun:
    """Parse the mesh (once) and fill every default of cfg; no other check (see preflight).

    Raises:
        ConfigError: the mesh, model preset or schedule cannot be read, naming the field.
    """
    mesh = parse_mesh(cfg.mesh)
    if cfg.model not in PRESETS:
        raise ConfigError(f"model: unknown preset {cfg.model!r}; choose one of {', '.join(PRESETS)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device: unknown {cfg.device!r}; choose one of {', '.join(DEVICES)} (cuda needs a GPU per rank)")
    if cfg.schedule not in SCHEDULES:
        raise ConfigError(f"schedule: unknown {cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    layout = SCHEDULES[cfg.schedule][1]
    local_stages = {"single": 1, "loop": cfg.stages_per_rank, "v": 2}[layout]
    filled = {k: v for k, v in PRESET_DATA[cfg.model].items() if getattr(cfg, k) is None}
    if not cfg.microbatches:
        filled["microbatches"] = mesh.pp * local_stages
    if cfg.run_dir is None:
        filled["run_dir"] = default_run_dir(mesh)
    overrides = {k: getattr(cfg, k) for k in ("dim", "n_layers", "n_heads", "ffn_dim") if getattr(cfg, k)}
    model = dataclasses.replace(PRESETS[cfg.model], **overrides)
    return TrainRun(dataclasses.replace(cfg, mesh=str(mesh), **filled), mesh, model, layout, local_stages)
