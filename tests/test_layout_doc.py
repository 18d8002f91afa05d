"""The docs match the tree: docs/layout.md names every module of simcluster/, launcher/ and train/
(and no module that is gone), and README.md links every page of docs/.

    python -m pytest -q tests/test_layout_doc.py
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_layout_names_every_module_and_no_other():
    text = (ROOT / "docs" / "layout.md").read_text()
    tree = text[text.index("```"):text.rindex("```")]
    modules = {p.relative_to(ROOT) for f in ("simcluster", "launcher", "train") for p in (ROOT / f).rglob("*.py")
               if p.name != "__init__.py" or f == "simcluster"}
    missing = sorted(str(m) for m in modules if m.name not in tree)
    assert not missing, f"docs/layout.md does not name: {missing}"
    folders = {p.parent.relative_to(ROOT).name for p in (ROOT / "launcher").rglob("*.py")} - {"launcher"}
    assert all(f"{f}/" in tree for f in folders), folders
    named = set(re.findall(r"\b([a-z_]+\.py)\b", tree))
    existing = {m.name for m in modules} | {"__init__.py"}
    assert named <= existing, f"docs/layout.md names modules that do not exist: {sorted(named - existing)}"


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(f"(docs/{p})" in readme for p in pages), [p for p in pages if f"(docs/{p})" not in readme]
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
