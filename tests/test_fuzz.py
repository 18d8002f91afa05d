"""Property tests (hypothesis) of the launcher's front door: any mesh spec, flag value or YAML
config either gives a valid compose file, or exit 2 with errors on stderr and no file; never a
traceback. No Docker, no torch; a fixed budget of examples, derandomized, so CI is repeatable.

    python -m pytest -q tests/test_fuzz.py
"""
from __future__ import annotations

import contextlib
import io
import math
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simcluster.launcher.cli
from simcluster.core.config import Config

BUDGET = settings(max_examples=120, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
FIELDS = [name for name in Config.__dataclass_fields__]


def generate(*args: str) -> tuple[int, str, Path]:
    """``launcher generate ARGS --out F`` in this process: (exit code, stderr, F)."""
    out = Path(tempfile.mkdtemp()) / "c.yml"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = simcluster.launcher.cli.main(["generate", *args, "--out", str(out)])
        except SystemExit as e:  # argparse's own usage errors
            code = e.code
    return code, err.getvalue(), out


def check(code: int, err: str, out: Path) -> dict | None:
    """The property: exit 0 with a valid compose document, or exit 2 with errors and no file."""
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.strip() and not out.exists() and list(out.parent.iterdir()) == []
        return None
    doc = yaml.safe_load(out.read_text())
    nodes = [s for s in doc["services"] if s != "rendezvous"]
    assert nodes and all(doc["services"][n]["command"][:3] == ["python", "-m", "simcluster.launcher.container.node"]
                         for n in nodes)
    return doc


dims = st.integers(min_value=-2, max_value=12)
mesh_specs = st.one_of(
    st.builds(lambda a, b, c: f"{a}x{b}x{c}", dims, dims, dims),
    st.builds(lambda a, b, c: f"pp={a},dp={b},tp={c}", dims, dims, dims),
    st.text(alphabet="0123456789xXpdt=,- ", max_size=12),
)


@BUDGET
@given(mesh_specs)
def test_any_mesh_spec(spec):
    code, err, out = generate("--mesh", spec, "--model", "tiny", "--n-layers", "12")
    doc = check(code, err, out)
    if doc is not None:  # a valid mesh: one node per pipeline stage
        pp = int(spec.lower().replace("pp=", "").replace("x", ",").split(",")[0])
        assert len(doc["services"]) == pp + 1
    elif code == 2:
        assert "error" in err


scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**6, max_value=10**6),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                   st.sampled_from(["2x2x2", "1x1x1", "tiny", "small", "1f1b", "zbv", "gpipe", "1e-3", "nan"]))
configs = st.dictionaries(st.sampled_from(FIELDS + ["bogus", "stepz"]),
                          st.one_of(scalar, st.lists(scalar, max_size=2)), max_size=6)


@BUDGET
@given(configs)
def test_any_yaml_config(values):
    path = Path(tempfile.mkdtemp()) / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    code, err, out = generate("--config", str(path))
    check(code, err, out)
    bad_float = any(isinstance(v, float) and not math.isfinite(v) for v in values.values())
    if bad_float or any(k in ("bogus", "stepz") for k in values):
        assert code == 2, values


flag_values = st.one_of(st.integers(min_value=-5, max_value=300).map(str), st.sampled_from(
    ["nan", "inf", "-inf", "1e9", "0", "0.5", "x", "", "2x2x2", "gpipe", "tiny", "3g", "-1"]))


@BUDGET
@given(st.dictionaries(st.sampled_from(["--steps", "--lr", "--global-batch", "--microbatches", "--seq-len",
                                        "--n-heads", "--dim", "--schedule", "--timeout-s", "--cpus-per-node",
                                        "--memory-per-node", "--join-timeout-s", "--val-fraction", "--seed",
                                        "--model", "--nodes"]), flag_values, max_size=4),
       st.sampled_from(["2x2x2", "4x1x2", "1x1x1", "2x1x1"]))
def test_any_flags(flags, mesh):
    args = [x for k, v in flags.items() for x in (k, v)]
    check(*generate("--mesh", mesh, "--model", "tiny", *args))
