"""``--env KEY=VALUE``: variables for every rank of the job (a framework's switches: WANDB_MODE,
HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TOKENIZERS_PARALLELISM, ...), checked at the edge.

    python -c "from simcluster.launcher.job.env import env_pairs; print(env_pairs(['WANDB_MODE=offline']))"

Each engine sets them on every node beside its own (engines/document.py node_env), so torchrun hands
them to each rank. Refused, naming the entry and the fix: no ``=``, a key that is not a POSIX name,
a key given twice (the first value would be lost), and a key the cluster owns: torchrun's rank
variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and its options (``PET_*``:
torchrun reads PET_NPROC_PER_NODE as --nproc-per-node), the node's own (PYTHONPATH, which puts the
instruments first, PATH, HOME, OMP_NUM_THREADS, sized from --cpus-per-node, GLOO_SOCKET_IFNAME,
CUDA_VISIBLE_DEVICES), the interpreter's home and path (PYTHONHOME, PYTHONPLATLIBDIR, PYTHONSAFEPATH:
the node wrapper cannot start without them as the image set them) and every SIMCLUSTER_* variable (the
launcher's options set those). Any other ``PYTHON*`` value is tried once: the host's interpreter starts
with it, and one it refuses or warns about (PYTHONHASHSEED=abc, PYTHONIOENCODING=bogus) is refused
with its own words; a torch variable every rank reads at its first process group (TORCH_READS: the
Flight Recorder's size and dump, gloo's lazy init, the debug level) or torchrun as it starts (LOGLEVEL)
only with a value torch takes.
A key one of our options sets too is refused with that option (``env_conflicts``). An entry longer than the kernel lets one variable be (MAX_ARG_STRLEN) or
entries together larger than ENV_BUDGET (of the kernel's ARG_MAX for a process's start) are refused
with the limit.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

from simcluster.core.errors import ConfigError
from simcluster.core.flightrec import SIZE_KEYS

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OWNED = {
    "RANK": "torchrun", "LOCAL_RANK": "torchrun", "WORLD_SIZE": "torchrun", "LOCAL_WORLD_SIZE": "torchrun",
    "GROUP_RANK": "torchrun", "GROUP_WORLD_SIZE": "torchrun", "ROLE_RANK": "torchrun", "ROLE_NAME": "torchrun",
    "ROLE_WORLD_SIZE": "torchrun", "NODE_RANK": "the node's index", "MASTER_ADDR": "the rendezvous",
    "MASTER_PORT": "the rendezvous", "PYTHONPATH": "the node wrapper (the instruments first)",
    "PATH": "the image", "HOME": "the node", "OMP_NUM_THREADS": "--cpus-per-node",
    "GLOO_SOCKET_IFNAME": "the node's network", "CUDA_VISIBLE_DEVICES": "--nproc-per-node (one device a rank)",
    "PYTHONUNBUFFERED": "the log follower",
    "PYTHONHOME": "the image's interpreter (another home: the node wrapper cannot start)",
    "PYTHONPLATLIBDIR": "the image's interpreter (another library folder: the node wrapper cannot start)",
    "PYTHONSAFEPATH": "the node wrapper (it imports simcluster from its working folder)",
    "PYTHONEXECUTABLE": "the image's interpreter", "PYTHONINSPECT": "the node wrapper (a rank would wait "
    "at an interactive prompt after its script)",
}
PREFIXES = {"SIMCLUSTER_": "the launcher's own options", "TORCHELASTIC_": "torchrun",
            "PET_": "torchrun (it reads PET_NAME as its option --name)"}
# Linux: one "KEY=VALUE\0" string of a process's environment is at most MAX_ARG_STRLEN bytes (32 pages),
# all of them with the command line at most ARG_MAX (a quarter of the stack limit: 2 MiB with 8 MiB)
MAX_ARG_STRLEN = 32 * 4096
ENV_BUDGET = 1 << 20  # --env's share of ARG_MAX: half, the other half the image's, the node's and the command line
EXAMPLE = "e.g. --env WANDB_MODE=offline (env=['WANDB_MODE=offline'])"
# torch variables every rank reads as its first process group starts -> (the values it takes, what it does with
# another): checked here, since a rank that gets another dies before its first line (torch 2.13, gloo, tried).
_COUNT = (r"\d{1,6}", "a whole number of entries from 0 to 999999 (torch reads it with std::stoi: a non-number or "
          "one over 2^31-1 aborts every rank with 'terminate called', and a ring of 2^31-1 entries never exits)")
_BOOL = (r"(?i:0|1|true|false|yes|no|y|n)", "0, 1, true, false, yes, no, y or n (another: 'RuntimeError: Invalid "
         "value for environment variable' as the process group starts)")
_MS = (r"\d{1,9}", "a whole number from 0 to 999999999 (torch reads it with std::stoi: a non-number or one over "
       "2^31-1 aborts every rank of the GPU cluster's job as its first NCCL process group starts)")
TORCH_READS = {
    SIZE_KEYS[0]: _COUNT, SIZE_KEYS[1]: _COUNT, "TORCH_GLOO_LAZY_INIT": _BOOL,
    "TORCH_DISTRIBUTED_DEBUG": (r"(?i:OFF|INFO|DETAIL)", "OFF, INFO or DETAIL (another: 'ValueError: The value of "
                                "TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL' at import torch.distributed)"),
    # the Flight Recorder's dump on a real cluster (simcluster/core/flightrec.py dump_env; your value wins there)
    "TORCH_NCCL_DUMP_ON_TIMEOUT": _BOOL, "TORCH_NCCL_ENABLE_MONITORING": _BOOL,
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": _MS, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": _MS,
    # torchrun's agent: logging.setLevel(LOGLEVEL) at its import (torch.distributed.elastic.utils.logging)
    "LOGLEVEL": (r"CRITICAL|FATAL|ERROR|WARN|WARNING|INFO|DEBUG|NOTSET", "one of CRITICAL, ERROR, WARNING, INFO, DEBUG "
                 "or NOTSET, in capitals (torchrun hands it to logging.setLevel as it starts: another, 'info' or '10' "
                 "too, ends every node with \"ValueError: Unknown level\" before a rank starts)"),
}


def _error(problem: str) -> ConfigError:
    e = ConfigError(problem)
    e.field = "env"
    return e


def _owner(key: str) -> str | None:
    if key in OWNED:
        return OWNED[key]
    return next((who for prefix, who in PREFIXES.items() if key.startswith(prefix)), None)


def env_pairs(entries) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE entries -> ((KEY, VALUE), ...) in the order given.

    Raises:
        ConfigError: (field ``env``) an entry without ``=``, a key that is no POSIX name, one given twice,
        one the cluster owns, an entry or all of them beyond the kernel's limits, a PYTHON* value the
        interpreter refuses; naming the entry and the fix.
    """
    out: dict[str, str] = {}
    total = 0
    for entry in entries:
        key, eq, value = entry.partition("=")
        size = len(entry.encode("utf-8", "surrogateescape")) + 1
        total += size
        if not eq:
            problem = f"env: {entry!r} has no '='; give KEY=VALUE, {EXAMPLE}"
        elif not KEY.match(key):
            problem = f"env: {key!r} (in {entry!r}) is not a variable name (letters, digits, _; not a digit first); {EXAMPLE}"
        elif key in out:
            problem = f"env: {key} is given twice ({key}={out[key]!r} and {entry!r}); give it once"
        elif owner := _owner(key):
            problem = f"env: {key} is set by the cluster ({owner}) on every rank; drop it from --env"
        elif key in TORCH_READS and not re.fullmatch(TORCH_READS[key][0], value):
            problem = f"env: {key}={value!r}: torch takes {TORCH_READS[key][1]}; fix the value or drop it from --env"
        elif size > MAX_ARG_STRLEN:
            problem = (f"env: {key}=... is {size} bytes, and Linux starts no process with a variable over "
                       f"{MAX_ARG_STRLEN} bytes (MAX_ARG_STRLEN); pass such a value in a file your code reads")
        else:
            out[key] = value
            continue
        raise _error(problem)
    if total > ENV_BUDGET:
        raise _error(f"env: the --env entries take {total} bytes, over the {ENV_BUDGET} bytes a job's variables may "
                     f"take of the {2 * ENV_BUDGET} bytes (ARG_MAX) Linux starts a process with; pass large values "
                     f"in a file your code reads")
    _try_interpreter({k: v for k, v in out.items() if k.startswith("PYTHON")})
    return tuple(out.items())


def _try_interpreter(python_env: dict[str, str]) -> None:
    """Start this host's interpreter once with the PYTHON* variables given; refuse what it refuses or
    warns about (the image's Python reads them as this one does)."""
    if not python_env:
        return
    env = {"PATH": os.environ.get("PATH", os.defpath), **python_env}
    try:
        proc = subprocess.run([sys.executable, "-c", "pass"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return  # the probe itself failed: nothing is known about the values
    said = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    if proc.returncode != 0 or said:
        given = " ".join(f"{k}={v!r}" for k, v in python_env.items())
        why = next((ln for ln in said if "PYTHON" in ln or "Invalid" in ln or "Error" in ln), said[-1] if said
                   else f"exit {proc.returncode}")
        raise _error(f"env: the interpreter refuses {given}: {why}; fix the value or drop it from --env")


def env_conflicts(pairs, check_collectives: int | None, stall_s: float | None) -> None:
    """--env keys that one of our options sets too: refused with it, never one silently overriding the other.

    Raises:
        ConfigError: TORCH_DISTRIBUTED_DEBUG with --check-collectives (which sets it), or
            TORCH_FR_BUFFER_SIZE=0 (torch's Flight Recorder off; its older name where that is unset, as torch
            reads them: simcluster/core/flightrec.py SIZE_KEYS) while the stall watch, which reads it, is on.
    """
    env = dict(pairs)
    if "TORCH_DISTRIBUTED_DEBUG" in env and check_collectives is not None:
        raise _error(f"env: TORCH_DISTRIBUTED_DEBUG={env['TORCH_DISTRIBUTED_DEBUG']!r} meets --check-collectives "
                     f"{check_collectives}, which sets it (1: DETAIL); give one: --check-collectives 1, or the "
                     f"variable alone")
    key = next((k for k in SIZE_KEYS if k in env), SIZE_KEYS[0])  # the one torch reads
    fr = env.get(key)
    if fr is not None and fr.strip() in ("0", "") and stall_s != 0:
        raise _error(f"env: {key}={fr!r} turns torch's Flight Recorder off, and the stall watch "
                     f"(--stall-s, on unless 0) reads each rank's collectives from it; drop the variable, or turn "
                     f"the watch off with --stall-s 0")
