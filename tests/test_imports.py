"""Every import names its file, arrows point one way, and each file is one module object whichever
entry point loaded it (no Docker).

    python -m pytest -q tests/test_imports.py

The static half reads the source alone, as an import-graph tool or an IDE would, with no mapping
rule: every first-party import (function-level ones too) resolves to a path in the checkout
(``simcluster.launcher.job.launch`` -> simcluster/launcher/job/launch.py, through the link to
launcher/), the graph of modules has no cycle, nothing under train/ imports launcher/, the floor
simcluster/core/ imports nothing of the project but itself and no torch, launcher/ imports train/
only at the trainer's doors (TRAINER_DOORS), and launcher/'s folders stand on floors (FLOORS, drawn
in docs/layout.md) whose arrows point down only. The
dynamic half starts each entry point (``python -m launcher``, ``python -m simcluster``,
``python -m train``, ``python -m train.parity``, torchrun's ``-m train``, the pytest plugin),
imports every module of the project in that process at its exit, and finds no file loaded twice.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "train")  # the top-level folders simcluster/launcher and simcluster/train link to
FIRST_PARTY = ("simcluster",)
READERS = ("launcher", "train", "simcluster", "tests", "bench", "examples")  # every folder whose imports must resolve


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py")) if "__pycache__" not in p.parts]


def _module_of(path: Path) -> str | None:
    """simcluster.launcher.job.launch for launcher/job/launch.py; None outside the packages."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    if rel[0] == "simcluster":
        return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
    if rel[0] in PACKAGES:
        return ".".join(("simcluster",) + (rel[:-1] if rel[-1] == "__init__" else rel))
    return None


def _resolve(name: str) -> Path | None:
    """The file (or namespace folder) an absolute module name names, found by path from the checkout."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return base.resolve() if base.is_dir() else None


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names imported from it) of every import in a file, at any depth."""
    out = []
    package = _module_of(path)
    if package and path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                assert package, f"{path}: a relative import outside the packages"
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(parts + ([module] if module else []))
            out.append((node.lineno, module, [a.name for a in node.names]))
    return out


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """module -> the modules it imports (by real path), and every import that names no file."""
    edges: dict[str, set[str]] = {}
    unresolved = []
    for path in _sources(*READERS):
        if path.parent.name == "boot":  # sitecustomize: loaded by site, not imported by name
            continue
        here = str(path.resolve().relative_to(ROOT))
        for line, module, names in _imports(path):
            if module.split(".")[0] not in FIRST_PARTY:
                continue
            target = _resolve(module)
            if target is None:
                unresolved.append(f"{here}:{line} {module}")
                continue
            for name in names:  # `from simcluster.train import layout` names the module simcluster/core/layout.py
                sub = _resolve(f"{module}.{name}") if name != "*" else None
                if sub is not None and sub.suffix == ".py":
                    edges.setdefault(here, set()).add(str(sub.relative_to(ROOT)))
            if target.suffix == ".py":
                edges.setdefault(here, set()).add(str(target.relative_to(ROOT)))
    return edges, unresolved


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_first_party_import_names_a_file():
    edges, unresolved = _graph()
    assert not unresolved, f"imports that name no file of the checkout: {unresolved}"
    assert sum(len(v) for v in edges.values()) > 400  # the graph was read, function-level imports included


def test_the_import_graph_has_no_cycle_and_train_imports_nothing_of_launcher():
    edges, _ = _graph()
    assert not _cycles(edges), f"import cycles: {_cycles(edges)}"
    upward = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                    if a.startswith("train/") and b.startswith("launcher/"))
    assert not upward, f"train/ (the lower floor) imports launcher/: {upward}"


CORE = "simcluster/core/"  # the floor both sides stand on: the facts launcher/ and train/ share
# The only places launcher/ imports train/ (the torch side): where it starts or reads the trainer
# (docs/layout.md names them). Everything else launcher/ needs of the trainer's facts is simcluster/core/'s.
TRAINER_DOORS = (
    "launcher/cli.py",  # `launcher plan` / `project`: the planner (train/plan/command.py)
    "launcher/fullsize.py",  # `launcher plan --full-size`: the traces read and modelled (train/plan/fullsize/)
    "launcher/job/options.py",  # --memory-per-node: the planner's fit of each node's tensors (train/plan/fit.py)
    "launcher/job/entry.py",  # the built-in trainer's preflight before anything is launched (train/preflight.py)
    "launcher/container/node.py",  # the node wrapper starts the trainer's ranks (train/forkrun.py, forked_rank.py)
    "launcher/instrument/",  # loaded into a rank: the trainer's stall watch, traffic, trace, exit (torch there)
)


def test_the_floor_imports_no_torch_no_train_no_launcher():
    """simcluster/core/ imports only itself of the project, and no torch at any depth (function-level
    imports too); a fresh interpreter importing all of it loads no torch and nothing of train/ or launcher/."""
    edges, _ = _graph()
    core = [str(p.resolve().relative_to(ROOT)) for p in _sources("simcluster/core")]
    assert len(core) > 10, core
    out = sorted(f"{a} -> {b}" for a in core for b in edges.get(a, ()) if not b.startswith(CORE))
    assert not out, f"simcluster/core/ imports outside itself: {out}"
    torch = sorted(f"{a}:{line} {m}" for a in core for line, m, _ in _imports(ROOT / a) if m.split(".")[0] == "torch")
    assert not torch, f"simcluster/core/ imports torch: {torch}"
    names = [".".join(Path(a).with_suffix("").parts).removesuffix(".__init__") for a in core]
    code = (f"import importlib, sys; [importlib.import_module(n) for n in {names!r}]; "
            "print(sorted(n for n in sys.modules if n == 'torch' or n.startswith(('simcluster.train', 'simcluster.launcher'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_launcher_imports_train_only_where_it_starts_or_reads_the_trainer():
    edges, _ = _graph()
    into_train = {a: sorted(b for b in bs if b.startswith("train/")) for a, bs in edges.items() if a.startswith("launcher/")}
    stray = sorted(f"{a} -> {', '.join(bs)}" for a, bs in into_train.items()
                   if bs and not any(a == d or (d.endswith("/") and a.startswith(d)) for d in TRAINER_DOORS))
    assert not stray, f"launcher/ imports train/ outside the trainer's doors {TRAINER_DOORS} (use simcluster.core): {stray}"
    used = {d for d in TRAINER_DOORS for a, bs in into_train.items() if bs and (a == d or (d.endswith("/") and a.startswith(d)))}
    assert used == set(TRAINER_DOORS), f"a door imports nothing of train/ (drop it here and in docs/layout.md): {set(TRAINER_DOORS) - used}"
    into_core = {b for a, bs in edges.items() if a.startswith(("launcher/", "train/")) for b in bs if b.startswith(CORE)}
    assert len(into_core) > 10, into_core  # both sides stand on the floor


# launcher/'s floors, the top first (docs/layout.md draws them): a module imports its own floor's or a lower
# floor's modules only. A folder (or a top-level file) that is on no floor fails the test until it is placed.
FLOORS = (
    ("launcher/__main__.py", "launcher/cli.py", "launcher/parser.py", "launcher/parser_hints.py"),  # the door: the command line
    ("launcher/testing",),  # the pytest plugin: the API's fixture
    ("launcher/api.py", "launcher/compare.py", "launcher/compare_read.py", "launcher/sweep.py",
     "launcher/fullsize.py", "launcher/fullsize_checks.py"),  # the Python API
    ("launcher/engines",),  # one class per engine: render, up, status, logs, down; attach, nodes, hosts
    ("launcher/drills",),  # faults and shaping, asking the Engine they are handed
    ("launcher/observe",),  # following a run, its summary, its report
    ("launcher/docker",),  # the Docker floor: the SDK's Client, containers, images, hosts; the Compose CLI; Handle
    ("launcher/job",),  # the job's one frozen description
    ("launcher/container",),  # the programs inside the containers
    ("launcher/instrument",),  # what is loaded into the ranks of the user's code
)


def _floor(path: str) -> int | None:
    """The floor (0: the top) of a file under launcher/; None when it is on none."""
    for level, units in enumerate(FLOORS):
        if any(path == u or path.startswith(u + "/") for u in units):
            return level
    return None


def test_launchers_folders_stand_on_floors_and_import_downward_only():
    edges, _ = _graph()
    files = [str(p.resolve().relative_to(ROOT)) for p in _sources("launcher")]
    unplaced = sorted({f for f in files if _floor(f) is None})
    assert not unplaced, f"launcher/ files on no floor (place their folder in FLOORS and docs/layout.md): {unplaced}"
    upward = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                    if a.startswith("launcher/") and b.startswith("launcher/") and _floor(a) > _floor(b))
    order = " > ".join("+".join(u.removeprefix("launcher/") for u in units) for units in FLOORS)
    assert not upward, f"upward arrows between launcher/'s floors ({order}): {upward}"
    levels = {_floor(f) for f in files}
    assert levels == set(range(len(FLOORS))), "a floor holds no file"  # every floor is real, none stale
    downward = {(_floor(a), _floor(b)) for a, bs in edges.items() for b in bs
                if a.startswith("launcher/") and b.startswith("launcher/") and _floor(a) < _floor(b)}
    assert len(downward) > 20, downward  # the graph was read across the floors


def test_the_checkout_holds_no_second_name_for_its_packages():
    """launcher/ and train/ are namespace folders: `python -m launcher` loads no __init__.py under a
    bare name beside simcluster.launcher's."""
    for folder in PACKAGES:
        assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py would load twice"
        link = ROOT / "simcluster" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), f"simcluster/{folder}"


# Loaded as each entry point's process starts: import every module of the project by its one name;
# at the process's exit, report any file that two module objects hold.
PROBE = r'''
import atexit, importlib, json, os, sys

def _import_all(root):
    for top in ("launcher", "train", os.path.join("simcluster", "core")):
        for base, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "boot")]
            for f in files:
                if f.endswith(".py") and f != "__main__.py":
                    rel = os.path.relpath(os.path.join(base, f), root)[:-3].split(os.sep)
                    rel = rel[1:] if rel[0] == "simcluster" else rel
                    name = ".".join(["simcluster", *(rel[:-1] if rel[-1] == "__init__" else rel)])
                    importlib.import_module(name)

def _probe():
    root = os.environ["PROBE_ROOT"]
    seen = {}
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name in ("__main__", "__mp_main__") or not path:  # the entry itself (multiprocessing's alias too)
            continue
        real = os.path.realpath(path)
        if real.startswith(root + os.sep):
            seen.setdefault(real, []).append(name)
    with open(os.environ["PROBE_OUT"] + f".{os.getpid()}", "w") as fh:
        json.dump({"modules": len(seen), "twice": {k: v for k, v in seen.items() if len(v) > 1},
                   "bare": sorted(n for n, m in sys.modules.items() if n.split(".")[0] in ("launcher", "train")
                                  and getattr(m, "__file__", None))}, fh)

_import_all(os.environ["PROBE_ROOT"])
atexit.register(_probe)
'''

ENTRY_POINTS = {
    "python -m launcher": ["-m", "launcher", "generate", "--mesh", "2x1x1", "--stdout"],
    "python -m simcluster": ["-m", "simcluster", "generate", "--mesh", "2x1x1", "--stdout"],
    "python -m train": ["-m", "train", "--help"],
    "python -m train.parity": ["-m", "train.parity", "--help"],
    "torchrun -m train": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "train", "--help"],
    "the pytest plugin": ["-m", "pytest", "-p", "simcluster.launcher.testing.plugin", "-q", "--co", "-p", "no:cacheprovider",
                          "-n", "0", "tests/test_layout_doc.py"],
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_each_entry_point_loads_each_file_once(entry, tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "probe"), str(ROOT)]),
           "PROBE_ROOT": str(ROOT), "PROBE_OUT": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, *ENTRY_POINTS[entry]], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    reports = [json.loads(p.read_text()) for p in tmp_path.glob("out.*")]
    assert reports, f"{entry}: no report (rc {proc.returncode}): {proc.stderr[-2000:]}"
    for report in reports:
        assert report["modules"] > 90, report  # every module of launcher/ and train/ was imported
        assert not report["twice"], f"{entry}: files loaded as two modules: {report['twice']}"
        assert not report["bare"], f"{entry}: files under a bare name: {report['bare']}"
