"""One home per fact, read from the source (no Docker, no torch): every internal import under the
`simcluster` name, one rank-to-node rule, one reader of a run folder, the code folders, labels and tc
rates each in one module. Each test names the home and fails on the leaks it was written against.

    python -m pytest -q tests/test_one_home.py
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("launcher", "train", "bench", "simcluster")  # the project's own code (tests/ and examples/ too, for imports)


def _files(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _constants(path: Path) -> list[str]:
    """Every string constant of a module except docstrings."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_every_import_goes_through_simcluster():
    """A user's train.py, launcher.py or train/ comes first on their sys.path: a bare `import train`
    or `from launcher...` in our code would import theirs."""
    bad = []
    for path in _files(*CODE, "tests", "examples"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{_rel(path)}:{node.lineno} {n}" for n in names if n.split(".")[0] in ("launcher", "train")]
    bad = [b for b in bad if not b.startswith("tests/test_user_code.py")]  # (its user scripts are strings)
    assert not bad, "use simcluster.launcher / simcluster.train: " + ", ".join(bad)


def test_the_rank_to_node_rule_is_layout_node_of():
    """Which node holds a rank is worked out by simcluster/core/layout.py node_of alone (its inverse,
    node_ranks, beside it), and node names are made by layout.node_name alone."""
    divide = re.compile(r"\b(\w*rank\w*|peer|r)\s*//\s*[\w.]*(per_node|nproc\w*)\b")
    for path in _files("launcher", "train", "bench", "simcluster"):
        if _rel(path) == "simcluster/core/layout.py":
            continue
        text = path.read_text()
        assert not divide.search(text), f"{_rel(path)}: {divide.search(text).group(0)} (use layout.node_of)"
        assert 'f"node-{' not in text and "f'node-{" not in text, f"{_rel(path)} names nodes (use layout.node_name)"


def test_one_reader_of_a_run_folder():
    """metrics.jsonl is named in simcluster/core/rundir.py only (METRICS); everything else reads
    through read_metrics / last_step / MetricsTail there."""
    for path in _files("launcher", "train", "bench", "simcluster"):
        if _rel(path) != "simcluster/core/rundir.py":
            assert "metrics.jsonl" not in _constants(path), f"{_rel(path)} opens metrics.jsonl itself"


def test_code_folders_labels_and_rates_have_one_home():
    """The image's code layout: launcher/job/files.py (code_sources); container labels: layout.LABEL;
    tc rates: simcluster/core/units.py."""
    homes = {"code": "launcher/job/files.py", "label": "launcher/container/layout.py", "rate": "simcluster/core/units.py"}
    for path in _files("launcher", "train", "bench", "simcluster"):
        rel, consts = _rel(path), _constants(path)
        tree = ast.parse(path.read_text())
        pairs = [n for n in ast.walk(tree) if isinstance(n, (ast.Tuple, ast.List))
                 and {"train", "launcher"} <= {e.value for e in n.elts if isinstance(e, ast.Constant)}]
        if rel != homes["code"]:
            assert not pairs and not any(c.startswith("/app/") for c in consts), f"{rel} spells the code folders"
        if rel != homes["label"]:
            assert not any(c.startswith("io.simcluster.") for c in consts), f"{rel} spells a label prefix"
        if rel != homes["rate"]:
            assert not any("mbit" in c and "|" in c for c in consts), f"{rel} parses tc rates"


def test_a_link_that_loops_or_leads_nowhere_is_named_by_core_paths():
    """The words for a path that does not resolve (a link to itself, a link whose target is gone) are spelled in
    simcluster/core/paths.py alone (unresolved); before, five checks (mount sources, --out, --run-dir, a run
    folder to read, diagnose's folder) each spelled them, two without the link's target."""
    spelled = [_rel(p) for p in _files("launcher", "train", "bench", "simcluster")
               if any("leads nowhere" in c for c in _constants(p))]
    assert spelled == ["simcluster/core/paths.py"], spelled
