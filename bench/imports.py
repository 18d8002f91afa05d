"""Who imports train/ from the host side: per train/ module (or simcluster/core/ module), the launcher/ files
that import it and whether it needs torch; the counts the floor is measured by.

    python -m bench.imports
    python -m bench.imports --files

Read from the source alone (ast, function-level imports too). A module *needs torch* when it, or a
first-party module it imports at module level (followed), imports torch at module level; *torch inside*
when some function of it imports torch. Launcher importers: the files under launcher/ that import the
module at any depth. The totals: launcher/ files importing simcluster.train, and the train/ modules they reach.
"""
from __future__ import annotations

import argparse
import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = {"launcher": "launcher", "train": "train", "core": "simcluster/core"}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts if rel.parts[0] == "simcluster" else ("simcluster", *rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules imported at module level, at any depth), `from a import b` giving a.b too."""
    tree = ast.parse(path.read_text())
    top_nodes = set()
    for node in tree.body:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                break
            top_nodes.add(id(sub))
    top, every = set(), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        every.update(names)
        if id(node) in top_nodes and not _in_function(tree, node):
            top.update(names)
    return top, every


def _in_function(tree: ast.AST, target: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(sub is target for sub in ast.walk(node)):
                return True
    return False


def table() -> tuple[dict, dict]:
    files = {top: sorted(p for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)
             for top, d in TOPS.items() if (ROOT / d).is_dir()}
    mods = {_module(p): p for top in files for p in files[top]}
    imps = {m: _imports(p) for m, p in mods.items()}

    def torch_at_top(m: str, seen: set) -> bool:
        if m in seen:
            return False
        seen.add(m)
        top = imps[m][0]
        return any(n == "torch" or n.startswith("torch.") for n in top) or any(
            torch_at_top(n, seen) for n in top if n in mods)

    rows = {}
    for m, p in mods.items():
        if not (m.startswith("simcluster.train.") or m.startswith("simcluster.core.")):
            continue
        importers = sorted(str(q.relative_to(ROOT)) for q in files["launcher"] if m in imps[_module(q)][1])
        rows[m] = {"importers": importers, "torch": torch_at_top(m, set()),
                   "torch_inside": any(n == "torch" or n.startswith("torch.") for n in imps[m][1])}
    reach = [str(q.relative_to(ROOT)) for q in files["launcher"]
             if any(n.startswith("simcluster.train") for n in imps[_module(q)][1])]
    reached = sorted({n for q in files["launcher"] for n in imps[_module(q)][1]
                      if n in mods and n.startswith("simcluster.train.")})
    return rows, {"launcher files": len(files["launcher"]), "importing train": reach, "train modules reached": reached}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", action="store_true", help="list each module's importers")
    a = p.parse_args()
    rows, totals = table()
    print(f"{'module':44} {'launcher importers':>18}  torch")
    for m, r in sorted(rows.items(), key=lambda kv: (-len(kv[1]["importers"]), kv[0])):
        torch = "yes" if r["torch"] else "inside" if r["torch_inside"] else "no"
        print(f"{m:44} {len(r['importers']):>18}  {torch}")
        if a.files and r["importers"]:
            print("    " + " ".join(i.removeprefix("launcher/") for i in r["importers"]))
    print(f"launcher/ files importing simcluster.train: {len(totals['importing train'])} of {totals['launcher files']}; "
          f"train/ modules reached: {len(totals['train modules reached'])}")
    if a.files:
        print("reached: " + " ".join(m.removeprefix("simcluster.train.") for m in totals["train modules reached"]))


if __name__ == "__main__":
    main()
