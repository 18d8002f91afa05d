"""Node wrapper: torchrun for one simulated node, then report its exit code to the rendezvous.

    python -m simcluster.launcher.container.node --nnodes 2 --node-rank 0 --nproc-per-node 4 \
        --rdzv-endpoint rendezvous:29400 --run-id mesh-2x2x2 --run-dir /runs/mesh-2x2x2 \
        --lost-after-s 24.0 -- --mesh 2x2x2 --run-dir /runs/mesh-2x2x2

Runs inside the trainer image (the compose ``command`` of every node-K service):
  1. checks the run folder (--run-dir) is writable by this user; if not, exits 2 with the fix;
  2. runs ``python -m simcluster.train.forkrun --nnodes N --node-rank K --nproc-per-node P
     --rdzv-backend c10d --rdzv-endpoint rendezvous:29400 --rdzv-conf is_host=false
     --rdzv-id RUN_ID --local-addr HOSTNAME --tee 3 -m MODULE <train flags>`` -- torchrun's
     command line and agent, with the ranks forked after one import per node; this wrapper
     makes that import itself (its heartbeat needs torch too) and forks the agent from it
     (``forkrun.spawn``), so a node imports torch once (``--torchrun``: the stock ``torchrun``
     CLI instead, a subprocess) -- with log lines prefixed ``[rankR]:`` (R = global rank),
     forwarding SIGTERM/SIGINT to it;
     For the user's code (a script, or a module other than the trainer) each rank installs this
     project's instruments first (``instrument_env``; launcher/instrument/), forked or fresh.
  3. writes its exit code and why to the rendezvous store (launcher/container/rendezvous.py),
     stays until the rendezvous has exited (so `compose up --exit-code-from rendezvous` reports
     the verdict), and exits with it. A SIGTERM (`docker stop`) gives 143, "stopped by SIGTERM".
     The end is quiet: the heartbeat stops and closes its store client once it reads the
     rendezvous' FINISHED flag, and the wait for the rendezvous to exit makes no store call
     (the rules are in launcher/container/heartbeat.py). Steps 2's watch and 3: launcher/container/supervise.py.

Heartbeat: from the start, a thread registers this node in the rendezvous store and bumps its
heartbeat counter every second; the rendezvous declares a node lost when it goes silent for
--lost-after-s (the launcher passes LOST_FRACTION x the job's timeout, see launcher/container/layout.py)
or never registers within --join-timeout-s. When that verdict appears, this wrapper prints ``[node-0] error: node-1 (ranks 2-3)
lost: ...``, stops its torchrun (SIGTERM, SIGKILL after 2 s) and exits non-zero. If this
wrapper itself cannot reach the rendezvous for --lost-after-s (its container was cut off the
network), it stops its ranks likewise, naming itself as the node cut off. A rank process of this
node frozen (stopped) that long is named and stopped too (launcher/container/ranks.py): the
heartbeat thread and torchrun's agent would both see it as alive.

Rendezvous backend (both verified with 2- and 4-node probe clusters):
  c10d (default): the rendezvous container hosts the TCPStore, every node joins as a client
    (is_host=false). Node ranks go by sorted node address (DynamicRendezvousHandler sorts its
    participants), and --local-addr is the zero-padded hostname, so node-K gets ranks
    K*P .. (K+1)*P-1 whatever order the nodes arrive in. Workers then bootstrap from a store
    torchrun opens on node-0 (MASTER_ADDR=node-0, a free port), torch's standard layout.
  static: --node-rank fixes the order and workers use the rendezvous store directly
    (MASTER_ADDR=rendezvous, MASTER_PORT=29400); it works only because node 0's agent, told
    it is the master, opens an idle store server in its own container while its client
    still connects to --master-addr: an implementation detail, hence not the default.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

from simcluster.train import forkrun
from simcluster.train.forked_rank import RANK_HOOK
from simcluster.launcher.container.heartbeat import Heartbeat, report
from simcluster.launcher.container import workdir
from simcluster.launcher.container.compile_cache import cache_env
from simcluster.launcher.container.supervise import await_verdict, run_ranks, wait_for
from simcluster.launcher.instrument.rank import boot
from simcluster.launcher.instrument.spec import BOOT_DIR, ENABLE
from simcluster.launcher.container.layout import JOIN_TIMEOUT_S
from simcluster.core.layout import TRAINER_MODULE, rank_range
from simcluster.core.flightrec import SIZE_KEYS, rehearsal_entries

EXIT_CONFIG = 2


def instrument_env(env: dict) -> None:
    """Load the instruments into every rank of the user's code (launcher/instrument/boot): their
    folder first on PYTHONPATH, so each interpreter's ``site`` runs its sitecustomize, and
    SIMCLUSTER_INSTRUMENT=1. Both folders are found from this package, wherever the image holds
    it: the boot folder, and last the folder holding ``simcluster`` itself, which ``site`` must
    import before ``python -m`` puts the cwd on sys.path (the image's /app; after the user's
    entries, so their own modules still come first)."""
    import simcluster
    from simcluster.launcher import instrument

    folder = os.path.join(os.path.dirname(os.path.abspath(instrument.__file__)), BOOT_DIR)
    package_home = os.path.dirname(os.path.dirname(os.path.abspath(simcluster.__file__)))
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([folder, *rest, *([] if package_home in rest else [package_home])])
    env[ENABLE] = "1"
    env[RANK_HOOK] = f"{boot.__module__}:{boot.__name__}"  # a forked rank runs it as sitecustomize would


# torch's agent sends the rendezvous a keep-alive every 5 s and warns when one takes over its heartbeat timeout
# (torch's default 5 s): at 512 ranks on 2 cores the store takes longer (load 1,200) and every node warned,
# though nothing was lost (the rendezvous's own liveness is the node's heartbeat, launcher/container/rendezvous.py)
HEARTBEAT_TIMEOUT_S = 60


def torchrun_command(args: argparse.Namespace, node_name: str, train_argv: list[str]) -> list[str]:
    """The torchrun command line of this node."""
    if getattr(args, "torchrun", False):  # stock torchrun: every rank a fresh interpreter
        exe = shutil.which("torchrun")
        cmd = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    else:  # torchrun's agent, ranks forked after one import per node (launcher/forkrun.py)
        cmd = [sys.executable, "-m", "simcluster.train.forkrun"]
    return cmd + torchrun_args(args, node_name, train_argv)


def torchrun_args(args: argparse.Namespace, node_name: str, train_argv: list[str]) -> list[str]:
    """torchrun's arguments for this node (its command line without the executable)."""
    out = [f"--nnodes={args.nnodes}", f"--nproc-per-node={args.nproc_per_node}",
            f"--rdzv-backend={args.rdzv_backend}", f"--rdzv-endpoint={args.rdzv_endpoint}", f"--rdzv-id={args.run_id}"]
    if args.rdzv_backend == "static":  # c10d orders the nodes itself; torch warns "node_rank ... ignored" if given
        out.append(f"--node-rank={args.node_rank}")
    if args.rdzv_backend == "c10d":
        join = getattr(args, "join_timeout_s", None)
        conf = f"is_host=false,heartbeat_timeout={HEARTBEAT_TIMEOUT_S}"
        conf += f",join_timeout={int(join) + 60}" if join else ""  # our join verdict comes first
        out += [f"--rdzv-conf={conf}", f"--local-addr={node_name}"]
    else:  # static: the endpoint is the master address; node 0 "hosts" (idle), all use the rendezvous store
        host, _, port = args.rdzv_endpoint.rpartition(":")
        out += [f"--master-addr={host}", f"--master-port={port}", f"--local-addr={node_name}"]
    entry = [args.script] if args.script else ["-m", args.module]
    return [*out, "--tee=3", *entry, *train_argv]


def node_parser() -> argparse.ArgumentParser:
    """The node wrapper's own flags (everything after -- goes to the training module)."""
    parser = argparse.ArgumentParser(prog="python -m launcher.container.node", description=__doc__.split("\n\n")[0],
                                     epilog="Everything after -- goes to the training module.")
    parser.add_argument("--nnodes", type=int, required=True, help="nodes in the cluster (= pp)")
    parser.add_argument("--node-rank", type=int, required=True, help="this node's index K (0-based)")
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks on this node (= dp*tp)")
    parser.add_argument("--rdzv-endpoint", default="rendezvous:29400", help="HOST:PORT of the rendezvous store")
    parser.add_argument("--rdzv-backend", choices=("c10d", "static"), default="c10d", help="torchrun rendezvous")
    parser.add_argument("--run-id", default="simcluster", help="rendezvous id (the run name)")
    entry = parser.add_mutually_exclusive_group()
    entry.add_argument("--module", default="simcluster.train", help="module torchrun runs with -m (default simcluster.train)")
    entry.add_argument("--script", default=None, help="a script torchrun runs instead of a module")
    parser.add_argument("--workdir", default=None, help="the ranks' working directory (default: this one); made "
                        "when missing, with the code folder's entries linked in (--code-dir)")
    parser.add_argument("--code-dir", default=None, help="the code folder (read-only) whose entries the working "
                        "directory links, and that node 0 records in the run folder (launcher/container/workdir.py)")
    parser.add_argument("--node-name", default=None, help="this node's address (default: the hostname)")
    parser.add_argument("--torchrun", action="store_true",
                        help="start the ranks with stock torchrun (each a fresh interpreter: ~10 s slower start "
                             "on 2 cores) instead of launcher.forkrun (torchrun's agent, ranks forked after "
                             "one import per node)")
    parser.add_argument("--run-dir", default=None, help="the job's output folder: must be writable (checked first)")
    parser.add_argument("--lost-after-s", type=float, required=True,
                        help="a rendezvous silent this long means this node is cut off (the launcher passes "
                             "LOST_FRACTION x the job's timeout, see launcher/container/layout.py)")
    parser.add_argument("--join-timeout-s", type=float, default=JOIN_TIMEOUT_S,
                        help=f"rendezvous join timeout (default {JOIN_TIMEOUT_S:g}s; torchrun gets +60s)")
    parser.add_argument("--wait-for", default=None, metavar="FILE",
                        help="start the ranks only once FILE exists (the launcher writes it after shaping this "
                             "node's network); gives up after the join timeout")
    return parser


def ranks_env(args: argparse.Namespace, name: str) -> dict:
    """The ranks' environment: this one, torchrun's line prefix, gloo's lazy pairs, and the instruments
    for your code (not the built-in trainer); the working directory made and your code linked in."""
    if args.workdir:  # your code's ranks: a cluster's shared working directory, in the run folder
        os.makedirs(args.workdir, exist_ok=True)
        if args.code_dir:  # the code linked in before a rank starts; recorded once the heartbeat runs
            workdir.link(args.code_dir, args.workdir)
    env = dict(os.environ)
    env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:")
    # gloo's pairs made on first use, not a full mesh at each group's creation (a world of N ranks: N-1
    # connections a rank, through the rendezvous' store); a user's own setting wins
    env.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    if not any(k in env for k in SIZE_KEYS):  # a user's own, by either name, wins (ours would hide the older)
        env[SIZE_KEYS[0]] = str(rehearsal_entries(args.nnodes * args.nproc_per_node))  # torch's 2000 to 64 ranks
    cache_env(env, args.run_dir, name)  # torch.compile's code where it can be loaded (/tmp is noexec)
    if args.script or args.module != TRAINER_MODULE:
        instrument_env(env)
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, train_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = node_parser().parse_args(own)
    name = args.node_name or socket.gethostname()
    started = time.time()  # a hang.json older than this is a previous run's
    ranks = rank_range(args.node_rank, args.nproc_per_node)

    problem = workdir.check_writable(args.run_dir) if args.run_dir else None
    if problem:
        print(f"[{name}] error: {problem}", file=sys.stderr, flush=True)
        report(args.rdzv_endpoint, name, args.node_rank, args.nproc_per_node, EXIT_CONFIG)
        return EXIT_CONFIG

    env = ranks_env(args, name)
    cmd = torchrun_command(args, name, train_argv)
    agent = None
    if not args.torchrun:  # one import per node, shared with the heartbeat: the agent forked from here, not a
        # second interpreter; forked before the heartbeat's thread exists, held until start() below
        agent = forkrun.spawn(torchrun_args(args, name, train_argv), env, args.workdir)
    hb = Heartbeat(args.rdzv_endpoint, name, args.node_rank, args.nproc_per_node)
    hb.start()
    if args.workdir and args.code_dir and args.node_rank == 0:  # bounded reads (workdir.py), heartbeat already on
        print(f"[{name}] {workdir.record_line(args.code_dir, args.run_dir or args.workdir)}", flush=True)
    if args.wait_for and not wait_for(args.wait_for, args.join_timeout_s, name):
        if agent:
            agent.cancel()
        report(args.rdzv_endpoint, name, args.node_rank, args.nproc_per_node, EXIT_CONFIG)
        hb.halt.set()
        return EXIT_CONFIG
    print(f"[{name}] node {args.node_rank}/{args.nnodes}: {' '.join(cmd)}", flush=True)
    if agent:
        agent.start()
    proc = agent or subprocess.Popen(cmd, env=env, cwd=args.workdir)
    code, why, signalled = run_ranks(proc, hb, args, name, started)
    report(args.rdzv_endpoint, name, args.node_rank, args.nproc_per_node, code, reason=why, waits=not signalled)
    if not signalled:  # being stopped (compose down, docker stop): leave now
        await_verdict(hb, name, ranks, code != 0 and why is None)
    hb.halt.set()
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not sys.exit: a heartbeat stuck in a store call to a frozen rendezvous must not hold us
