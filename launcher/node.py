"""Node wrapper: torchrun for one simulated node, then report its exit code to the rendezvous.

    python -m launcher.node --nnodes 2 --node-rank 0 --nproc-per-node 4 \
        --rdzv-endpoint rendezvous:29400 --run-id mesh-2x2x2 -- --mesh 2x2x2 --run-dir /runs/mesh-2x2x2

Runs inside the trainer image (the compose ``command`` of every node-K service):
  1. checks the run folder (the value of --run-dir among the train flags) is writable by
     this user (uid 1000); if not, exits 2 with the fix;
  2. runs ``torchrun --nnodes N --node-rank K --nproc-per-node P --rdzv-backend c10d
     --rdzv-endpoint rendezvous:29400 --rdzv-conf is_host=false --rdzv-id RUN_ID
     --local-addr HOSTNAME --tee 3 -m MODULE <train flags>`` with log lines prefixed
     ``[rankR]:`` (R = global rank), forwarding SIGTERM/SIGINT to it;
  3. writes its exit code to the rendezvous store (see launcher/rendezvous.py) and exits with it.

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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from datetime import timedelta

from launcher.rendezvous import EXIT_KEY, REPORTED, report_key

EXIT_CONFIG = 2


def flag_value(argv: list[str], flag: str) -> str | None:
    """Value of ``--flag V`` or ``--flag=V`` in argv (the last one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def check_writable(run_dir: str) -> str | None:
    """None if this process can create files in run_dir (made if missing), else a message with the fix."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
        return None
    except OSError as e:
        try:
            st = os.stat(run_dir)
            owner = f"owner uid {st.st_uid}, mode {oct(st.st_mode & 0o7777)}"
        except OSError:
            owner = "missing"
        host = os.environ.get("SIMCLUSTER_HOST_RUN_DIR") or "the host folder mounted there"
        return (f"run folder {run_dir} is not writable by uid {os.getuid()} ({owner}: {e.strerror}). "
                f"Fix on the host: chmod 1777 {host} (before `docker compose up`), "
                f"or start the cluster with `python -m launcher up`, which creates it writable.")


def torchrun_command(args: argparse.Namespace, node_name: str, train_argv: list[str]) -> list[str]:
    """The torchrun command line of this node."""
    exe = shutil.which("torchrun")
    cmd = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    cmd += [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}", f"--nproc-per-node={args.nproc_per_node}",
            f"--rdzv-backend={args.rdzv_backend}", f"--rdzv-endpoint={args.rdzv_endpoint}", f"--rdzv-id={args.run_id}"]
    if args.rdzv_backend == "c10d":
        cmd += ["--rdzv-conf=is_host=false", f"--local-addr={node_name}"]
    else:  # static: the endpoint is the master address; node 0 "hosts" (idle), all use the rendezvous store
        host, _, port = args.rdzv_endpoint.rpartition(":")
        cmd += [f"--master-addr={host}", f"--master-port={port}", f"--local-addr={node_name}"]
    return cmd + ["--tee=3", "-m", args.module, *train_argv]


def report(endpoint: str, node_name: str, node_rank: int, nproc: int, code: int, timeout_s: float = 15) -> None:
    """Write this node's exit code to the rendezvous store; warn (not fail) if it is gone."""
    first = node_rank * nproc
    record = {"node": node_name, "node_rank": node_rank, "ranks": f"{first}-{first + nproc - 1}" if nproc > 1 else str(first),
              "exit_code": code}
    try:
        import torch.distributed as dist

        host, _, port = endpoint.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        store.set(EXIT_KEY + node_name, json.dumps(record))
        index = store.add(REPORTED, 1)
        store.set(report_key(index), node_name)
        print(f"[{node_name}] reported exit code {code} to {endpoint}", flush=True)
    except Exception as e:  # the rendezvous may have given up already
        print(f"[{node_name}] could not report exit code {code} to {endpoint}: {e}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, train_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m launcher.node", description=__doc__.split("\n\n")[0],
                                     epilog="Everything after -- goes to the training module.")
    parser.add_argument("--nnodes", type=int, required=True, help="nodes in the cluster (= pp)")
    parser.add_argument("--node-rank", type=int, required=True, help="this node's index K (0-based)")
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks on this node (= dp*tp)")
    parser.add_argument("--rdzv-endpoint", default="rendezvous:29400", help="HOST:PORT of the rendezvous store")
    parser.add_argument("--rdzv-backend", choices=("c10d", "static"), default="c10d", help="torchrun rendezvous")
    parser.add_argument("--run-id", default="simcluster", help="rendezvous id (the run name)")
    parser.add_argument("--module", default="train", help="module torchrun runs with -m (default train)")
    parser.add_argument("--node-name", default=None, help="this node's address (default: the hostname)")
    args = parser.parse_args(own)
    name = args.node_name or socket.gethostname()

    run_dir = flag_value(train_argv, "--run-dir")
    problem = check_writable(run_dir) if run_dir else None
    if problem:
        print(f"[{name}] error: {problem}", file=sys.stderr, flush=True)
        report(args.rdzv_endpoint, name, args.node_rank, args.nproc_per_node, EXIT_CONFIG)
        return EXIT_CONFIG

    env = dict(os.environ)
    env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:")
    cmd = torchrun_command(args, name, train_argv)
    print(f"[{name}] node {args.node_rank}/{args.nnodes}: {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum, _frame):
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = proc.wait()
    code = 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell
    print(f"[{name}] torchrun exited {code}", flush=True)
    report(args.rdzv_endpoint, name, args.node_rank, args.nproc_per_node, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
