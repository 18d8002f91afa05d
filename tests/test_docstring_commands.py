"""Every module's docstring run commands run, and every file the docstrings and docs/*.md name exists.

    python -m pytest -q -n 0 tests/test_docstring_commands.py

Each .py file under launcher/, train/, simcluster/ and bench/ opens with a docstring whose indented
lines starting with ``python`` or ``torchrun`` are its run commands (backslash continuations joined).
The ``python -c`` ones run for real, all in one interpreter (those reading a run folder under runs/
are compiled only: a checkout has none); every ``python -m`` entry point (and each `launcher`
subcommand) answers ``--help``; the cheap commands (`launcher plan` of one mesh on a named target or
none, `launcher generate --stdout`) run as written; every file a command names exists. Training
runs, clusters and benchmarks start nothing here: the cluster tests run those.
"""
from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.* as `python -m` finds it from the checkout root
TOPS = ("launcher", "train", "simcluster", "bench")
REF = re.compile(r"(?<![\w/.-])((?:launcher|train|bench|docs|simcluster|tests|images|examples)/[\w/.-]*\w"
                 r"\.(?:py|md|sh|yml|yaml|txt|toml))")
LEADS = ("python ", "python3 ", "torchrun ")


def modules() -> list[str]:
    """Every .py file of the project (the links simcluster/launcher, simcluster/train not followed)."""
    out = []
    for top in TOPS:
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not os.path.islink(os.path.join(folder, d)))
            out += [os.path.relpath(os.path.join(folder, f), ROOT) for f in sorted(files) if f.endswith(".py")]
    return out


def docstring(path: str) -> str | None:
    return ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8")), clean=False)


def commands(doc: str) -> list[str]:
    """The docstring's indented lines starting with python/torchrun, continuations joined, comments cut."""
    out, cur = [], None
    for line in doc.splitlines():
        if cur is not None:
            cur += " " + line.strip()
        elif line[:1].isspace() and re.sub(r"^(\S+=\S*\s+)+", "", line.strip()).startswith(LEADS) and (" -m " in line or " -c " in line
                                                                         or ".py" in line):
            cur = line.strip()
        else:
            continue
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
        else:
            out.append(cur)
            cur = None
    return out


def without_comment(cmd: str) -> str:
    """The command without its trailing ``# ...`` comment (one with no quote after it) and leading VAR=value."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or cmd[i - 1].isspace()):
            cmd = cmd[:i]
            break
    return re.sub(r"^(\S+=\S*\s+)+", "", cmd).strip()


def all_commands() -> list[tuple[str, str]]:
    return [(path, cmd) for path in modules() for cmd in commands(docstring(path) or "")]


def test_every_module_opens_with_its_run_commands():
    missing = [p for p in modules() if not commands(docstring(p) or "")]
    assert not missing, f"modules whose docstring shows no indented `python ...` run command: {missing}"


def test_python_c_commands_run():
    """Every ``python -c`` command, each in a fresh namespace of one interpreter, from the checkout root."""
    codes = []
    for path, cmd in all_commands():
        argv = shlex.split(without_comment(cmd))
        if argv[:2] in (["python", "-c"], ["python3", "-c"]):
            codes.append((path, argv[2]))
    assert len(codes) > 40
    runner = r"""
import contextlib, io, json, sys, traceback
bad = []
for path, code in json.load(sys.stdin):
    try:
        compiled = compile(code, path, "exec")
        if "runs/" in code or "mount_code" in code or "compare(" in code or "simcluster.run(" in code:
            continue  # reads a run folder (a checkout has none) or starts a cluster (the cluster tests do)
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compiled, {"__name__": "__main__"})
    except SystemExit as e:
        if e.code not in (0, None):
            bad.append(f"{path}: exit {e.code}: {code}")
    except BaseException:
        bad.append(f"{path}: {code}\n{traceback.format_exc(limit=-2)}")
print(json.dumps(bad))
"""
    proc = subprocess.run([sys.executable, "-c", runner], input=json.dumps(codes), capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not bad, "\n\n".join(bad)


def _entry(argv: list[str]) -> tuple[str, str | None] | None:
    """(module, launcher subcommand or None) of a ``python -m`` / ``torchrun -m`` command."""
    if "-m" not in argv:
        return None
    i = argv.index("-m")
    module = argv[i + 1]
    sub = argv[i + 2] if module in ("launcher", "simcluster") and len(argv) > i + 2 and argv[i + 2][:1].isalpha() else None
    return module, sub


def test_entry_points_answer_help():
    """``--help`` of every ``python -m``/``torchrun -m`` module and `launcher` subcommand the
    docstrings run, in one interpreter (each exits 0 through argparse, starting nothing)."""
    entries = set()
    for _, cmd in all_commands():
        found = _entry(shlex.split(without_comment(cmd).replace("|", " ")))
        if found and found[0] != "pytest":
            name = f"simcluster.{found[0]}" if found[0].split(".")[0] in ("launcher", "train") else found[0]
            spec = importlib.util.find_spec(name)
            assert spec is not None, f"no module {found[0]}: {cmd}"
            if spec.submodule_search_locations is not None:  # a package: its __main__.py, a command line
                entries.add(found)
            elif spec.origin and "argparse" in Path(spec.origin).read_text(encoding="utf-8"):
                entries.add(found)
    assert ("launcher", "up") in entries and ("train", None) in entries
    runner = r"""
import contextlib, io, json, runpy, signal, sys, traceback
def busy(*_):  # CPU time, not wall: importing torch on a loaded machine took over 20 s of wall clock
    raise TimeoutError("no --help within 20 s of CPU: it started something")
def waits(*_):
    raise TimeoutError("no --help within 120 s: it waits on something")
signal.signal(signal.SIGPROF, busy)
signal.signal(signal.SIGALRM, waits)
bad = []
for module, sub in json.load(sys.stdin):
    sys.argv = [module] + ([sub] if sub else []) + ["--help"]
    out = io.StringIO()
    signal.setitimer(signal.ITIMER_PROF, 20)
    signal.alarm(120)
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        bad.append(f"{' '.join(sys.argv)}: returned without exiting")
    except SystemExit as e:
        if e.code not in (0, None) or "usage" not in out.getvalue().lower():
            bad.append(f"python -m {' '.join(sys.argv)}: exit {e.code}: {out.getvalue()[-300:]}")
    except BaseException:
        bad.append(f"python -m {' '.join(sys.argv)}: {traceback.format_exc(limit=-3)}")
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.alarm(0)
print(json.dumps(bad))
"""
    proc = subprocess.run([sys.executable, "-c", runner], input=json.dumps(sorted(entries, key=str)),
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not bad, "\n\n".join(bad)


def _plain(cmd: str) -> list[str] | None:
    """The command with its ``[optional]`` parts dropped, or None where a placeholder remains."""
    text = re.sub(r"\[[^\]]*\]", " ", without_comment(cmd))
    argv = shlex.split(text)
    if any(a == "..." or "|" in a or re.fullmatch(r"[A-Z][A-Z_]*(=.*)?", a) for a in argv):
        return None
    return argv


def cheap(argv: list[str]) -> bool:
    """`launcher plan` of one mesh (no search, no `local` calibration) and `launcher generate --stdout`."""
    if argv[1:3] != ["-m", "launcher"] or len(argv) < 4:
        return False
    if argv[3] == "plan":
        return "--search" not in argv and "local" not in argv and "--recalibrate" not in argv
    return argv[3] == "generate" and "--stdout" in argv


def test_cheap_commands_run_as_written():
    ran = []
    for path, cmd in all_commands():
        argv = _plain(cmd)
        if argv and cheap(argv):
            proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=ROOT, timeout=120)
            assert proc.returncode == 0, f"{path}: {cmd}\n{proc.stderr[-2000:]}"
            ran.append(cmd)
    assert len(ran) >= 2, ran


def test_files_the_commands_name_exist():
    """A path a run command names (a script, a config, an example) is in the checkout; run folders
    (runs/) and the files a command writes (--out) are its outputs."""
    gone = []
    for path, cmd in all_commands():
        argv = shlex.split(without_comment(cmd).replace("[", " ").replace("]", " ").replace("|", " "))
        for before, arg in zip(["", *argv], argv):
            arg = arg.split("=", 1)[-1]
            if before in ("--out", "--run-dir", "-o") or arg.startswith(("runs/", "/")) or "/" not in arg:
                continue
            if re.fullmatch(r"[\w./-]+\.(py|yml|yaml|md|json|sh|txt)", arg) and not (ROOT / arg).exists():
                gone.append(f"{path}: {arg} ({cmd})")
    assert not gone, "\n".join(gone)


def test_no_docstring_or_docs_page_names_a_file_that_is_gone():
    texts = {p: docstring(p) or "" for p in modules()}
    texts.update({os.path.relpath(p, ROOT): Path(p).read_text(encoding="utf-8")
                  for p in glob.glob(str(ROOT / "docs" / "*.md"))})
    gone = [f"{name}: {m.group(1)}" for name, text in texts.items() for m in REF.finditer(text)
            if not (ROOT / m.group(1)).exists()]
    assert not gone, "files named but gone:\n" + "\n".join(gone)


@pytest.mark.parametrize("doc, expected", [
    ('x\n\n    python -m launcher up \\\n        --mesh 2x2x2   # c\n', ["python -m launcher up --mesh 2x2x2   # c"]),
    ('x\n\n    torchrun opens on each node\n    python -c "import os"\n', ['python -c "import os"']),
])
def test_commands_are_collected(doc, expected):
    assert commands(doc) == expected
