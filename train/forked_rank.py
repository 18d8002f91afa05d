"""What a rank forked by forkrun runs: the entry a fresh interpreter would, in this one.

    python -c "from simcluster.train.forked_rank import preload; preload('simcluster.train', module=True)"

forkrun (train/forkrun.py) imports ``preload``'s modules once per node and forks
every rank from that process; the rank then calls ``run_module`` (``python -m MODULE ARGS``) or
``run_script`` (``python SCRIPT ARGS``). Each makes the state a fresh interpreter starts with
where a fork differs: the default signal dispositions, line-buffered output, ``sys.argv``,
``sys.path[0]`` (the script's folder, or the working directory for ``-m``), ``__name__ ==
"__main__"``, each rank's own random seeds (Python's, numpy's, torch's CPU generator), and, for the user's code (SIMCLUSTER_INSTRUMENT=1), this project's instruments
installed first, as the boot folder's sitecustomize installs them in a fresh interpreter
(launcher/instrument/boot/). One difference stays: a ``sitecustomize`` of the user's own on
PYTHONPATH ran once in the node wrapper, not once per rank.

What is imported before the fork: torch and torch.distributed (``STACK``) for every entry, and
for the built-in trainer also the trainer itself and the modules its package lists in
``TRAINER_PRELOAD``. The user's own module or script is never imported there: its top-level code may
read RANK or start a process group, and it runs in each rank as under stock torchrun.
"""
from __future__ import annotations

import importlib
import os
import runpy
import signal
import sys
import traceback

from simcluster.train import stallwatch
from simcluster.core.layout import TRAINER_MODULE

# Imported before the fork for any entry: what every torchrun script imports (torch: 1.3 s of a
# rank's 2.7 s of imports). Not DTensor, FSDP2 or pipelining for the user's code: a rank then
# holds the modules its code imports, as under stock torchrun. With them imported a DDP script that
# destroys its process group before its model hung at exit in 3 runs of 10 traced
# (--trace-steps), against 0 in 12 without (torch's deadlock, docs/own-code.md).
STACK = ("torch", "torch.distributed")
TRAINER_PRELOAD = ("simcluster.train.trainer",)  # and the built-in trainer's whole stack (DTensor, FSDP2, pipelining, DCP)
# "module:function" that each forked rank calls before its entry, as a fresh interpreter's
# sitecustomize would (the node wrapper names the launcher's instruments here for the user's code):
# this floor runs it by name and imports nothing of the launcher.
RANK_HOOK = "SIMCLUSTER_RANK_HOOK"


def preload(entry: str, module: bool) -> None:
    """Import ``STACK`` and, when ``entry`` is the built-in trainer (``module`` True: a ``-m``
    name), the trainer and every module named in ``TRAINER_PRELOAD`` (DTensor, FSDP2,
    pipelining, DCP). Raises ImportError as the import would."""
    for name in STACK:
        importlib.import_module(name)
    if module and entry == TRAINER_MODULE:  # not `train`: a package of the user's may have that name
        for name in TRAINER_PRELOAD:
            importlib.import_module(name)


def _as_fresh_interpreter(argv0: str, argv: tuple[str, ...], path0: str) -> None:
    """The state a fresh interpreter gives the entry, where this fork's differs."""
    # A fresh interpreter's signal dispositions, not the agent's handlers this fork inherited
    # (those raise in Python and would wait for a rank blocked in a collective to return).
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # One write per line: unbuffered (PYTHONUNBUFFERED), print() writes its text and its newline
    # apart, and torchrun's --tee tail, reading the rank's log file in between, printed half a line
    # that the next rank's line then continued ("stages=[0][rank1]:[simcluster] rank=1 ...").
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=False)
    if argv0 != TRAINER_MODULE:  # the built-in trainer seeds itself, as before
        _fresh_seeds()
    sys.argv = [argv0, *argv]
    if path0 not in sys.path[:1]:
        sys.path.insert(0, path0)
    if hook := os.environ.get(RANK_HOOK):  # e.g. the launcher's instruments of the user's code
        module, _, function = hook.partition(":")
        getattr(importlib.import_module(module), function)()


def _fresh_seeds() -> None:
    """Each rank its own random state, as a fresh interpreter seeds it from the OS (the fork copied
    the agent's): Python's ``random``, numpy's global generator if imported, torch's CPU generator
    (torch 2.13 seeds it nondeterministically in each process). A simulated GPU then seeds the
    device's generator with CUDA's fixed default seed (launcher/instrument/gpu/device.py)."""
    import random
    random.seed()
    if (np := sys.modules.get("numpy")) is not None:
        np.random.seed()
    if (torch := sys.modules.get("torch")) is not None:
        torch.default_generator.seed()


def _run(body) -> None:
    """Run the entry: None when it exits 0 (the agent collects that as the rank's return value);
    any other exit status ends the rank's process with that status, as it would a fresh
    interpreter's, so the agent reports the rank failed."""
    try:
        body()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except BaseException:  # the rank's own stderr shows its traceback, as a fresh interpreter's would
        if stallwatch.declared():  # a consequence of the declared hang (a peer left first): exit as the hang
            stallwatch.exit_as_hang()
        traceback.print_exc()
        sys.stderr.flush()
        raise


def run_module(module: str, *argv: str) -> None:
    """Body of one forked rank: ``python -m module *argv`` in this interpreter (see ``_run``)."""
    _as_fresh_interpreter(module, argv, os.getcwd())
    loaded = sys.modules.get(module)
    if loaded is not None and not hasattr(loaded, "__path__"):  # a plain module preload imported: run it
        del sys.modules[module]  # afresh as __main__, as a fresh interpreter does (and runpy warns otherwise)
    _run(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


def run_script(path: str, *argv: str) -> None:
    """Body of one forked rank: ``python path *argv`` in this interpreter (see ``_run``)."""
    _as_fresh_interpreter(path, argv, os.path.dirname(os.path.abspath(path)))
    _run(lambda: runpy.run_path(path, run_name="__main__"))
