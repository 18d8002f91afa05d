"""torchrun that imports torch once per node and forks its ranks from there.

    python -m simcluster.train.forkrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \
        --rdzv-endpoint=rendezvous:29400 --rdzv-id=run -m train --mesh 2x2x2
    python -m simcluster.train.forkrun --standalone --nproc-per-node=4 examples/llama_2d.py --dp 2 --tp 2

Takes torchrun's own command line (``torch.distributed.run.parse_args``) and runs torchrun's
own elastic agent (``elastic_launch``: the same rendezvous, restarts, log prefixes, exit
codes), with one difference: the ranks are not fresh interpreters. This process first imports
torch.distributed and, for the built-in trainer, the trainer and the modules it lists in
``PRELOAD`` (DTensor, FSDP2, pipelining, DCP); each rank is then forked from a copy of it (a
function entrypoint, which torchrun supports for Python functions) and runs ``python -m MODULE
ARGS`` or ``python SCRIPT ARGS`` as a fresh interpreter would (runpy, ``__name__ ==
"__main__"``; the user's code with its instruments installed first), with RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by the agent (train/forked_rank.py).
``--no-python`` and ``--run-path`` are refused.

Why: on a simulated node every rank shares the node's few cores, and `import torch` plus the
distributed stack costs each fresh interpreter about 2.7 s of CPU (1.3 s torch, 1.4 s the
rest, measured on this project's machine); 8 ranks importing at once on 2 cores spent ~13 s
before the first collective. Forked ranks share the imported pages (copy-on-write), so the
per-rank cost is gone. The training code is unchanged: on a real cluster the same code runs
under plain ``torchrun``, and ``python -m launcher.container.node --torchrun`` uses plain torchrun here too.

Fork safety: the ranks are forked from a process with one thread. torchrun's agent is not one
once it runs: the c10d rendezvous' keep-alive thread, and under ``--standalone`` the libuv
threads of the TCPStores it hosts, which serve the ranks already started while the next one is
forked. A fork copies whatever lock such a thread holds at that instant, held forever, and 1
forked rank in a few dozen 2x2x2 runs hung before its process group (the store timed out on
its key; the suite's parity runs showed it). So ``main`` first forks, while this process is
still single-threaded, the server of multiprocessing's "forkserver" start method
(``start_fork_server``; the stock one would exec a fresh interpreter and import torch again),
and the agent runs with ``start_method="forkserver"``, which torchrun supports: each rank is
forked by that server from the imported modules. No tensor computation runs before (no
intra-op thread pool exists) and each rank creates its own process group. Before the fork,
``gc.freeze()`` moves the imported objects into the collector's permanent generation (as the
``gc`` docs advise for forking servers): a rank's collections never walk them, so they neither
cost the rank's CPU nor write to (copy) the pages the ranks share.

For the built-in trainer the process that imports also runs, before any fork (in the node
wrapper, so that the wrapper, the agent, the fork server and the ranks share its pages), one step
of the job's own configuration as the node's first rank on torch's fake process group
(train/warmup.py): the code every rank will run is then specialized, and the caches it fills
made, once in the shared pages instead of copied into each rank (BENCHMARKS.md, "512 ranks").

One import per node, not two: the node wrapper (launcher/container/node.py) needs torch itself
(its heartbeat is a TCPStore client), so it does not start this module as a second interpreter
that would import torch again (1.3 s of CPU a node). It calls ``spawn``: the module is imported
in the wrapper, and the agent (``main``) runs in a child forked from it, before the ranks are
forked from that child. ``python -m simcluster.train.forkrun`` (the parity tool, tests) runs
the same ``main`` in a fresh interpreter.
"""
from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import uuid

from simcluster.train.forked_rank import preload, run_module, run_script
from simcluster.core.layout import TRAINER_MODULE
from simcluster.train.warmup import warm_up


class ForkedAgent:
    """The agent's child process, as the node wrapper supervises it: the calls of
    ``subprocess.Popen`` it uses, and the gate ``spawn`` holds it at. poll() returns None while
    it runs, then its exit code (-N: killed by signal N, as Popen's returncode)."""

    def __init__(self, pid: int, gate: int):
        self.pid = pid
        self.returncode: int | None = None
        self._gate = gate  # write end of the pipe the child waits on

    def start(self) -> None:
        """Let the child run torchrun's agent."""
        os.write(self._gate, b"1")
        os.close(self._gate)

    def cancel(self) -> None:
        """Let the child exit without starting (it exits 2), and reap it."""
        os.close(self._gate)
        self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:  # not after it was reaped: its pid may be another process's
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def preload_command(argv: list[str]) -> None:
    """``preload`` what the entry of a torchrun command line (``argv``: torchrun's arguments)
    needs. An import that fails is left to ``main``, which fails on it with its traceback."""
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    if not args.no_python and not args.run_path:
        try:
            preload(args.training_script, module=args.module)
        except Exception:  # noqa: BLE001 - main imports it again and reports it as a fresh interpreter would
            return
        warm(args)


_WARMED: list[tuple] = []  # the trainer command lines warmed in this process (and so in its forks)


def warm(args) -> None:
    """For the built-in trainer, its first step run once here, as the node's first rank
    (train/warmup.py; SIMCLUSTER_NODE x ranks a node), unless this process (or the one it was
    forked from: the node wrapper, for the agent) has warmed this command line already."""
    key = (args.training_script, tuple(args.training_script_args))
    if not args.module or args.training_script != TRAINER_MODULE or key in _WARMED:
        return
    _WARMED.append(key)
    nproc = int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else 0
    warm_up(list(args.training_script_args), rank=int(os.environ.get("SIMCLUSTER_NODE", "0")) * nproc)


def spawn(argv: list[str], env: dict[str, str], cwd: str | None = None) -> ForkedAgent:
    """Import the ``-m`` module of ``argv`` (torchrun's arguments) here (``preload_command``),
    then fork a child that will run ``main(argv)`` once ``start()`` is called on the returned
    handle, sharing those imports. Call it while this process has no other thread: a lock another thread holds at the
    fork (a TCPStore client's, the resolver's) stays held in the child, which then hangs on it.
    The gate lets the caller start its own threads (a heartbeat) and checks after the fork.

    The child takes ``env`` as its environment and ``cwd`` as its working directory, and ends
    with main's exit status, as ``python -m simcluster.train.forkrun ARGV`` would: 0, a
    SystemExit's code, or 1 after printing an exception's traceback; 2 if cancelled (or this
    process ended) before ``start()``.
    """
    preload_command(argv)
    sys.stdout.flush()  # nothing buffered may be copied into the child
    sys.stderr.flush()
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(gate_r)
        return ForkedAgent(pid, gate_w)
    os.close(gate_w)
    go = os.read(gate_r, 1)  # b"" when the parent cancels or ends
    os.close(gate_r)
    code = 2
    try:
        if go:
            code = 1
            os.environ.clear()
            os.environ.update(env)
            if cwd:
                os.chdir(cwd)
            from torch.distributed.elastic.multiprocessing.errors import record

            record(main)(argv)
            code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
        sys.excepthook(*sys.exc_info())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.no_python or args.run_path:
        sys.exit("simcluster.train.forkrun: --no-python and --run-path are not supported "
                 "(give a Python script or -m MODULE, or use torchrun)")
    if args.standalone:  # as torchrun's run(): a c10d store of its own on a free local port (not
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"  # the static backend's fixed 29500,
        args.rdzv_id, args.nnodes = uuid.uuid4().hex, "1"  # which two runs on one machine would share)
    if args.master_port is None:  # as torchrun's run(): only the static backend reads it
        args.master_port = 29500
    preload(args.training_script, module=args.module)
    warm(args)
    config, _, _ = config_from_args(args)
    config.start_method = "forkserver"
    gc.freeze()  # the imported objects out of every collection, so a rank's collector never rescans (and dirties) them
    server = start_fork_server()  # now, while this process has one thread: the agent's start below
    try:
        entry = run_module if args.module else run_script
        elastic_launch(config=config, entrypoint=entry)(args.training_script, *args.training_script_args)
    finally:
        stop_fork_server(server)


def start_fork_server() -> int:
    """Fork, from this process as it is now, the server that multiprocessing's "forkserver"
    start method asks for each new process (``multiprocessing.forkserver.main``), and register it
    as this process's fork server; returns its pid.

    The stock server is a fresh interpreter (``ForkServer.ensure_running`` execs one) that would
    import torch and the training code again; this one is a copy of this process and so holds
    them. Call it while this process has one thread (a lock another thread holds at the fork
    stays held in the server and in every rank it forks). The server ends when this process and
    every process it forked have closed the "alive" pipe, as the stock one does;
    ``stop_fork_server`` reaps it.
    """
    from multiprocessing import connection, forkserver, util

    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    if not util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    sys.stdout.flush()  # nothing buffered may be copied into the server (and its ranks)
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(alive_w)
            forkserver.main(listener.fileno(), alive_r, [])
        except SystemExit:
            pass
        except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
            sys.excepthook(*sys.exc_info())
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    listener.close()
    os.close(alive_r)
    server = forkserver._forkserver  # what ensure_running() checks: a live pid is used as it is
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return pid


def stop_fork_server(pid: int, wait_s: float = 10.0) -> None:
    """Close this process's end of the fork server's "alive" pipe and reap the server, waiting up
    to ``wait_s`` seconds: it exits once the ranks it forked have exited too (they hold the pipe
    while they run; the agent has ended them when its run returns or raises)."""
    import time
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid == pid and server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    deadline = time.monotonic() + wait_s
    try:
        while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    except ChildProcessError:
        pass


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    record(main)()
