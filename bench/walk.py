"""The walk of a data path through the project's files: `generate --mesh 2x2x2` and `simcluster.run(script=...)`
up to the engine (its render / up), with sys.setprofile.

    python -m bench.walk generate
    python -m bench.walk run
    python -m bench.walk declarations --commit HEAD

Method: in a fresh interpreter every project module the path needs is imported first (import time is not
the path), then sys.setprofile records each Python call and return whose code lives in a project file
(launcher/, train/, simcluster/), from the command's entry (cli.main / simcluster.run) until the engine's
render (generate) or up (run) is called; the engine's method is replaced by one that stops the walk.
Files: the distinct project files a recorded call ran in. Returns to an earlier file: the recorded
returns from a frame of one file into a caller frame of another project file.

declarations: per option of `up`/`generate` (not the trainer's own), the files at a commit that declare
it: its flag with help (add_argument), a Spec, a dataclass field with its default (job/launch.py,
engines/base.py, job/sections.py) or a field-by-field copy (``name=req.name``), among the files that
declare options (launcher/job/, parser.py, cli.py, api.py, compare.py, engines/base.py, testing/plugin.py).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Stop(Exception):
    pass


def walk(kind: str) -> tuple[list[str], int, int]:
    """(files in first-visit order, calls, returns to an earlier file)."""
    sys.path.insert(0, ROOT)
    import simcluster  # noqa: F401
    from simcluster.launcher import cli, api  # noqa: F401
    from simcluster.launcher.engines import registry
    from simcluster.launcher.job import options  # noqa: F401

    def stop(*a, **k):
        raise Stop

    for engine in registry.ENGINES.values():
        type(engine).render = stop
        type(engine).up = stop
    from simcluster.launcher.job.files import CODE_FOLDERS

    tops = tuple(os.path.join(ROOT, d) + os.sep for d in (*CODE_FOLDERS, "simcluster"))
    real = {}

    def rel(code) -> str | None:
        f = code.co_filename
        if f not in real:
            p = os.path.realpath(f)
            real[f] = os.path.relpath(p, ROOT) if p.startswith(tops) and "/tests/" not in p else None
        return real[f]

    files: list[str] = []
    counts = {"calls": 0, "returns": 0}

    def prof(frame, event, arg):
        if event not in ("call", "return"):
            return
        here = rel(frame.f_code)
        if here is None or frame.f_code.co_name == "<module>":
            return
        if event == "call":
            counts["calls"] += 1
            if here not in files:
                files.append(here)
        else:
            back = frame.f_back
            while back is not None and back.f_code.co_name == "<module>":
                back = back.f_back
            caller = rel(back.f_code) if back is not None else None
            if caller is not None and caller != here:
                counts["returns"] += 1

    os.chdir(ROOT)
    sys.setprofile(prof)
    try:
        if kind == "generate":
            cli.main(["generate", "--mesh", "2x2x2", "--stdout"])
        else:
            import simcluster as sc
            sc.run(script="examples/ddp.py", nodes=2, nproc_per_node=2, args=["--steps", "3"],
                   run_dir="/tmp/walk-run-dir-never-made")
    except Stop:
        counts["reached"] = 1
    finally:
        sys.setprofile(None)
    if not counts.get("reached"):
        raise SystemExit(f"{kind}: the walk ended before the engine")
    return files, counts["calls"], counts["returns"]


DECLARING = ("launcher/parser.py", "launcher/cli.py", "launcher/api.py", "launcher/compare.py",
             "launcher/engines/base.py", "launcher/testing/plugin.py")
FIELD_HOMES = ("launcher/job/launch.py", "launcher/engines/base.py", "launcher/job/sections.py")


def declarations(commit: str) -> dict[str, list[str]]:
    """option -> the files declaring it at commit (see the module docstring)."""
    sys.path.insert(0, ROOT)
    from simcluster.launcher.job.fields import FIELDS, specs
    from simcluster.launcher.job.sections import TrainerOptions

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    files = [f for f in git("ls-tree", "-r", "--name-only", commit, "launcher").split()
             if f.endswith(".py") and (f.startswith("launcher/job/") or f in DECLARING)]
    texts = {f: git("show", f"{commit}:{f}") for f in files}
    out = {}
    for n in (n for n in FIELDS if n not in specs(TrainerOptions)):
        pats = [re.compile(rf'add_argument\(\s*"{re.escape("--" + n.replace("_", "-"))}"'), re.compile(rf'"{n}": Spec\('),
                re.compile(rf'\b{n}=(req|args)\.{n}\b')]
        field = re.compile(rf'^    {n}: [^=\n]+=', re.M)
        where = sorted(f for f, t in texts.items() if any(p.search(t) for p in pats)
                       or (f in FIELD_HOMES and field.search(t)))
        if where:  # an option of this commit
            out[n] = where
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("generate", "run", "declarations"))
    p.add_argument("--files", action="store_true", help="list the files too")
    p.add_argument("--commit", default="HEAD", help="declarations: at this commit (default HEAD)")
    a = p.parse_args()
    if a.kind == "declarations":
        found = declarations(a.commit)
        for name, where in found.items():
            print(f"{name}: {len(where)} {' '.join(where)}")
        print(f"mean {sum(map(len, found.values())) / len(found):.2f} files per option over {len(found)} options")
        return
    files, calls, returns = walk(a.kind)
    print(f"{a.kind}: {len(files)} files, {calls} calls, {returns} returns to an earlier file")
    if a.files:
        print("\n".join(files))


if __name__ == "__main__":
    main()
