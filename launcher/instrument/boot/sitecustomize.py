"""Loads this project's instruments into every rank of the user's own code, before that code runs.

    PYTHONPATH=launcher/instrument/boot SIMCLUSTER_INSTRUMENT=1 RANK=0 SIMCLUSTER_OUTPUT_DIR=/tmp/r python examples/ddp.py

The node wrapper (launcher/container/node.py) puts this folder first on PYTHONPATH for a script
or module job, so Python's ``site`` imports this file at the start of every interpreter below
it: the node's torchrun agent (no RANK: nothing happens), each rank (RANK set by torchrun: the
instruments are installed, torch still unimported), and any interpreter a rank starts itself
(its pid is not the one recorded in SIMCLUSTER_INSTRUMENT_PID: nothing happens). The user's code
then starts exactly as stock torchrun starts it. A ``sitecustomize`` further down sys.path (the
image's or the user's) is run after this one, as if this one were not there.
"""
import os
import sys


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file shadows, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _boot() -> None:
    if os.environ.get("SIMCLUSTER_INSTRUMENT") != "1" or "RANK" not in os.environ:
        return  # not a rank of the user's code: simcluster is not even imported
    try:
        from simcluster.launcher.instrument.rank import boot
    except Exception as e:  # noqa: BLE001 - an instrument must never stop the user's code
        print(f"[simcluster] instruments not installed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return
    boot()  # the rules (which process is a rank) live there, shared with a forked rank


_boot()
_chain()
