"""The walk of a data path through the project's files: `generate --mesh 2x2x2` and `simcluster.run(script=...)`
up to the engine (its render / up), with sys.setprofile.

    python -m bench.walk generate
    python -m bench.walk run

Method: in a fresh interpreter every project module the path needs is imported first (import time is not
the path), then sys.setprofile records each Python call and return whose code lives in a project file
(launcher/, train/, simcluster/), from the command's entry (cli.main / simcluster.run) until the engine's
render (generate) or up (run) is called; the engine's method is replaced by one that stops the walk.
Files: the distinct project files a recorded call ran in. Returns to an earlier file: the recorded
returns from a frame of one file into a caller frame of another project file.
"""
from __future__ import annotations

import argparse
import os
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("generate", "run"))
    p.add_argument("--files", action="store_true", help="list the files too")
    a = p.parse_args()
    files, calls, returns = walk(a.kind)
    print(f"{a.kind}: {len(files)} files, {calls} calls, {returns} returns to an earlier file")
    if a.files:
        print("\n".join(files))


if __name__ == "__main__":
    main()
