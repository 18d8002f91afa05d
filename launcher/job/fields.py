"""The fields of a job request: each option of `up` and `generate`, its type, its default, its range
and a valid example; one value checked (``check_value``) or converted from command-line text (``from_text``).

    python -c "from simcluster.launcher.job.fields import FIELDS, check_value; print(check_value('steps', 3), FIELDS['nodes'])"

Pure and argparse-free: the request (request.py) checks every keyword with it, and the CLI's text
is typed by it, so both refuse a bad value with one message: the field, the value and an example.
A bool is no int, an int field refuses floats and text, a float field takes an int but never a
non-finite number (nor an int too large for a float), a list field refuses a mapping or a string.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from simcluster.launcher.container.layout import IMAGE, JOIN_TIMEOUT_S
from simcluster.launcher.engines.registry import DEFAULT, ENGINES
from simcluster.launcher.job.checks import MIN_CPUS
from simcluster.launcher.job.launch import RDZV_BACKENDS, EngineOptions
from simcluster.train.config import Config
from simcluster.train.errors import ConfigError
from simcluster.train.plan.hardware import GPU_NAMES

MAX_INT = 2**63 - 1  # every int field's bound unless its own is smaller (the trainer's seed is < 2**63)
MAX_STEPS = 10**7  # steps, total_steps and a traced step: far beyond any simulated run
MAX_NODES = 64  # nodes (containers) of one simulated cluster
MAX_RANKS = 64  # ranks per node
MAX_RESTARTS = 100


@dataclass(frozen=True)
class Spec:
    """One field: kind (int, float, str, bool, strs: a list of text, pairs: NODE -> seconds), its
    default, the inclusive range lo..hi of a number, the choices of a text, an example value."""

    kind: str
    default: object = None
    example: object = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    strict_lo: bool = False  # lo itself refused (a duration > 0)
    unit: str = ""  # after the bound: " CPUs", " seconds"


_CONFIG_EXAMPLES = {"mesh": "2x2x2", "model": "tiny", "dim": 64, "n_layers": 4, "n_heads": 4, "ffn_dim": 128,
                    "seq_len": 64, "global_batch": 8, "data": "data/corpus.txt", "run_dir": "runs/mesh-2x2x2",
                    "resume": "runs/mesh-2x2x2", "trace_steps": "2,3", "steps": 3}


def _config_specs() -> dict[str, Spec]:
    out = {"config": Spec("str", None, "run.yaml")}
    for f in fields(Config):
        kind = f.type.split("|")[0].strip()
        example = _CONFIG_EXAMPLES.get(f.name, f.default)
        lo = 1 if f.name == "steps" else None
        hi = MAX_STEPS if f.name in ("steps",) else None
        out[f.name] = Spec(kind, None, example, lo, hi)
    out["timeout_s"] = Spec("float", None, 60.0, 0, None, strict_lo=True)
    return out


JOB = {
    "script": Spec("str", None, "examples/ddp.py"), "module": Spec("str", None, "mypkg.train"),
    "code": Spec("str", None, "examples"), "nodes": Spec("int", None, 2, 1, MAX_NODES),
    "nproc_per_node": Spec("int", None, 2, 1, MAX_RANKS), "mount": Spec("strs", (), "/tmp/data:/data:ro"),
    "total_steps": Spec("int", None, 5, 1, MAX_STEPS), "no_cpu_bridges": Spec("bool", False, True),
    "no_simulated_gpus": Spec("bool", False, True), "gpu": Spec("str", None, "h100-sxm", choices=GPU_NAMES),
    "requirements": Spec("str", None, "requirements.txt"), "env": Spec("strs", (), "WANDB_MODE=offline"),
    "wheel": Spec("strs", (), "dist/mypkg-0.1-py3-none-any.whl"),
}
NODE = {
    "cpus_per_node": Spec("float", None, 1.0, MIN_CPUS, None, unit=" CPUs"), "memory_per_node": Spec("str", None, "3g"),
    "strict_memory": Spec("bool", False, True), "image": Spec("str", IMAGE, IMAGE),
    "rdzv_backend": Spec("str", "c10d", "c10d", choices=RDZV_BACKENDS), "mount_code": Spec("bool", False, True),
    "join_timeout_s": Spec("float", JOIN_TIMEOUT_S, 120.0, 0, None, strict_lo=True),
    "torchrun": Spec("bool", False, True), "inter_node_bandwidth": Spec("str", None, "100mbit"),
    "inter_node_latency": Spec("str", None, "10ms"), "user": Spec("str", None, "1000:1000"),
}
ENGINE = {
    "target": Spec("str", DEFAULT, DEFAULT, choices=tuple(ENGINES)), "workdir": Spec("str", None, "/shared/simcluster"),
    "setup": Spec("str", None, "module load pytorch"), "container_image": Spec("str", None, "nvcr.io/nvidia/pytorch:24.05-py3"),
    "runs_claim": Spec("str", EngineOptions.runs_claim, EngineOptions.runs_claim),
    "hosts": Spec("int", None, 2, 1, MAX_NODES), "inter_host_bandwidth": Spec("str", None, "100mbit"),
}
UP = {
    "build": Spec("bool", False, True), "keep": Spec("bool", False, True), "quiet": Spec("bool", False, True),
    "progress_every": Spec("float", 10.0, 10.0, 0, 86400, strict_lo=True),
    "max_restarts": Spec("int", 0, 1, 0, MAX_RESTARTS), "start_late": Spec("pairs", (), {"node-1": 20}),
    "wall_timeout_s": Spec("float", None, 600.0), "metric_regex": Spec("str", None, r"^step (?P<step>\d+) loss (?P<value>\S+)"),
}
GENERATE = {"out": Spec("str", None, "compose/mesh-2x2x2.yml"), "stdout": Spec("bool", False, True)}
# every field, in the command line's order (the header's regenerate line lists them so)
FIELDS: dict[str, Spec] = {**_config_specs(), **JOB, **NODE, **ENGINE, **UP, **GENERATE}
UP_ONLY = tuple(UP)
GENERATE_ONLY = tuple(GENERATE)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def example(name: str) -> str:
    """``steps=3 (--steps 3)``: a valid value of the field, as a keyword and as a flag."""
    ex = FIELDS[name].example
    if FIELDS[name].kind == "bool":
        return f"{name}=True ({flag(name)})"
    if FIELDS[name].kind == "pairs":
        return f"{name}={ex!r} ({' '.join(f'{flag(name)} {k}={v}' for k, v in ex.items())})"
    if FIELDS[name].kind == "strs":
        return f"{name}=[{ex!r}] ({flag(name)} {ex})"
    return f"{name}={ex!r} ({flag(name)} {ex})"


def _bad(name: str, value, need: str) -> ConfigError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    e = ConfigError(f"{name}: must be {need}, got {shown}; e.g. {example(name)}")
    e.field = name
    return e


def _number(name: str, spec: Spec, value):
    kind = {"int": "an int", "float": "a finite number"}[spec.kind]
    need = kind
    if spec.lo is not None:
        need = f"{'>' if spec.strict_lo else '>='} {spec.lo}"
        need += f" and <= {spec.hi}" if spec.hi is not None else ""
        need += f"{spec.unit} ({kind})"
    if isinstance(value, bool) or not isinstance(value, (int, float) if spec.kind == "float" else int):
        raise _bad(name, value, need)
    if spec.kind == "float":
        try:
            value = float(value)
        except OverflowError:  # an int beyond a float's range
            raise _bad(name, value, need) from None
        if not math.isfinite(value):
            raise _bad(name, value, need)
    elif abs(value) > MAX_INT:
        raise _bad(name, value, need)
    if spec.lo is not None and (value < spec.lo or (spec.strict_lo and value == spec.lo)):
        raise _bad(name, value, need)
    if spec.hi is not None and value > spec.hi:
        raise _bad(name, value, need)
    return value


def check_value(name: str, value):
    """One field's value, checked and normalised (an int for a float field -> float, a list -> tuple,
    start_late's mapping -> sorted (node, seconds) pairs); None (unset) passes for any field.

    Raises:
        ConfigError: naming the field, the value and an example (``e.field`` is the field's name).
    """
    spec = FIELDS[name]
    if value is None:
        return spec.default
    if spec.kind == "bool":
        if not isinstance(value, bool):
            e = ConfigError(f"{name}: a switch ({flag(name)}): pass True or False, got {value!r}")
            e.field = name
            raise e
        return value
    if spec.kind in ("int", "float"):
        return _number(name, spec, value)
    if spec.kind == "str":
        if not isinstance(value, str):
            raise _bad(name, value, "text")
        if spec.choices and value not in spec.choices:
            raise _bad(name, value, f"one of {', '.join(spec.choices)}")
        return value
    if spec.kind == "strs":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise _bad(name, value, "a list of text (a mapping or a string is not flattened)")
        return tuple(value)
    if isinstance(value, dict):  # pairs: start_late
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.partition("=")[::2] for v in value]
    else:
        raise _bad(name, value, "a mapping NODE -> seconds")
    out = []
    for node, sec in items:
        if isinstance(sec, str):
            sec = from_text(name, sec, kind="float") if sec.strip() else None
        if not isinstance(node, str) or not node or sec is None or isinstance(sec, bool) \
                or not isinstance(sec, (int, float)) or not math.isfinite(sec) or sec < 0 or sec > 86400:
            raise _bad(name, value, "a mapping NODE -> seconds in 0..86400")
        if any(node == seen for seen, _ in out):
            raise _bad(name, value, f"each node once ({node} is given twice: one start-late per node, e.g. "
                                    f"--start-late {node}={sec:g})")
        out.append((node, float(sec)))
    return tuple(sorted(out))


def from_text(name: str, text: str, kind: str | None = None):
    """Command-line text -> the field's value (``"3"`` -> 3 for an int field), or the text itself.

    Raises:
        ConfigError: text that is no number of the field's kind, with check_value's message.
    """
    kind = kind or FIELDS[name].kind
    if kind not in ("int", "float") or not isinstance(text, str):
        return text
    try:
        return int(text.strip()) if kind == "int" else float(text.strip())
    except ValueError:
        pass
    if kind == FIELDS[name].kind:
        check_value(name, text)  # raises its message: text is no number
    raise _bad(name, text, "a number")
