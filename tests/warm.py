"""``python -m MODULE ARGS`` (or ``python SCRIPT ARGS``) for the tests, forked from one warm
interpreter per pytest worker.

    from warm import run, start
    proc = run("simcluster.train", ["--model", "tiny", "--steps", "2"], cwd=ROOT, env=ENV)  # CompletedProcess
    job = start("simcluster.train", [...], cwd=ROOT, env=ENV)  # job.pid leads its own session; job.wait()
    proc = run("examples/ddp.py", ["--steps", "3"], cwd=ROOT, env=ENV, script=True)  # python examples/ddp.py

A fresh interpreter running the trainer first imports torch, DTensor, FSDP2, pipelining and DCP:
about 3 s of CPU on this project's 2-core machine, more than a short test run itself. Here the
import is made once, by multiprocessing's fork server (started on first use, ``PRELOAD``), and each
run is a fork of it, as a cluster node forks its ranks (train/forkrun.py).

The child is what ``python -m MODULE ARGS`` would be where the tests look: launcher/container/
forked_rank.py's ``run_module`` or ``run_script`` (the ones a cluster's ranks run) gives it the argv,
sys.path[0] (the working directory, or the script's folder), ``__main__``, the default signal dispositions and unbuffered lines; it gets the
given environment and working directory, stdin from /dev/null, and exits as the module would (0,
SystemExit's code, 1 after an uncaught exception's traceback). It leads a session of its own, so
``os.killpg(job.pid, sig)`` reaches it as it would a ``start_new_session=True`` Popen. What differs
from a fresh interpreter: a variable torch reads at import (not at use) has the pytest worker's
value, and atexit handlers do not run (nor do they in a forked rank).
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import tempfile
import threading

PRELOAD = ["warm", "simcluster.train.forked_rank", "simcluster.train.trainer"]
_lock = threading.Lock()
_context = None


def _ctx():
    global _context
    with _lock:
        if _context is None:
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(PRELOAD)
        return _context


def _child(entry: str, script: bool, args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    os.setsid()
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    from simcluster.train.forked_rank import run_module, run_script

    (run_script if script else run_module)(entry, *args)


class Job:
    """A started ``python -m MODULE`` (``python SCRIPT``): ``pid``, ``poll()`` and ``wait()`` as
    subprocess.Popen's (the exit status, negative for a signal); ``result()`` the finished run's
    CompletedProcess."""

    def __init__(self, entry: str, args: list[str], cwd: str, env: dict[str, str], capture: bool, script: bool):
        self.argv = ["python", *(() if script else ("-m",)), entry, *args]
        self._tmp = tempfile.TemporaryDirectory(prefix="warm-") if capture else None
        self._out, self._err = (os.devnull, os.devnull)
        if self._tmp is not None:
            self._out, self._err = (os.path.join(self._tmp.name, n) for n in ("out", "err"))
            for path in (self._out, self._err):
                open(path, "wb").close()
        self._process = _ctx().Process(target=_child, args=(entry, script, list(args), str(cwd), dict(env), self._out,
                                                            self._err))
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises subprocess.TimeoutExpired (the run killed) past ``timeout`` seconds."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
            raise subprocess.TimeoutExpired(self.argv, timeout, *self._read())
        return self._process.exitcode

    def _read(self) -> tuple[str, str]:
        if self._tmp is None:
            return "", ""
        texts = []
        for path in (self._out, self._err):
            with open(path, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
        return texts[0], texts[1]

    def result(self, timeout: float | None = None) -> subprocess.CompletedProcess:
        code = self.wait(timeout)
        out, err = self._read()
        if self._tmp is not None:
            self._tmp.cleanup()
        return subprocess.CompletedProcess(self.argv, code, out, err)


def start(entry: str, args: list[str], *, cwd: str, env: dict[str, str], capture: bool = False,
          script: bool = False) -> Job:
    """Start ``python -m entry *args`` (``python entry *args`` if ``script``; see the module's
    docstring); its output goes to /dev/null unless ``capture``."""
    return Job(entry, args, cwd, env, capture, script)


def run(entry: str, args: list[str], *, cwd: str, env: dict[str, str], timeout: float = 300, script: bool = False
        ) -> subprocess.CompletedProcess:
    """Run ``python -m entry *args`` (``python entry *args`` if ``script``) to its end, its stdout and
    stderr captured as text, like ``subprocess.run(..., capture_output=True, text=True, timeout=timeout)``."""
    return start(entry, args, cwd=cwd, env=env, capture=True, script=script).result(timeout)
