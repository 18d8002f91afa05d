"""``--env KEY=VALUE``: variables for every rank of the job (a framework's switches: WANDB_MODE,
HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TOKENIZERS_PARALLELISM, ...), checked at the edge (pure).

    python -c "from simcluster.launcher.job.env import env_pairs; print(env_pairs(['WANDB_MODE=offline']))"

Each engine sets them on every node beside its own (engines/document.py node_env), so torchrun hands
them to each rank. Refused, naming the entry and the fix: no ``=``, a key that is not a POSIX name,
a key given twice (the first value would be lost), and a key the cluster owns: torchrun's rank
variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), the node's own (PYTHONPATH,
which puts the instruments first, PATH, HOME, OMP_NUM_THREADS, sized from --cpus-per-node,
GLOO_SOCKET_IFNAME, CUDA_VISIBLE_DEVICES) and every SIMCLUSTER_* variable (the launcher's options
set those).
"""
from __future__ import annotations

import re

from simcluster.core.errors import ConfigError

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OWNED = {
    "RANK": "torchrun", "LOCAL_RANK": "torchrun", "WORLD_SIZE": "torchrun", "LOCAL_WORLD_SIZE": "torchrun",
    "GROUP_RANK": "torchrun", "GROUP_WORLD_SIZE": "torchrun", "ROLE_RANK": "torchrun", "ROLE_NAME": "torchrun",
    "ROLE_WORLD_SIZE": "torchrun", "NODE_RANK": "the node's index", "MASTER_ADDR": "the rendezvous",
    "MASTER_PORT": "the rendezvous", "PYTHONPATH": "the node wrapper (the instruments first)",
    "PATH": "the image", "HOME": "the node", "OMP_NUM_THREADS": "--cpus-per-node",
    "GLOO_SOCKET_IFNAME": "the node's network", "CUDA_VISIBLE_DEVICES": "--nproc-per-node (one device a rank)",
    "PYTHONUNBUFFERED": "the log follower",
}
EXAMPLE = "e.g. --env WANDB_MODE=offline (env=['WANDB_MODE=offline'])"


def env_pairs(entries) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE entries -> ((KEY, VALUE), ...) in the order given.

    Raises:
        ConfigError: (field ``env``) an entry without ``=``, a key that is no POSIX name, one given twice,
        or one the cluster owns, naming the entry and the fix.
    """
    out: dict[str, str] = {}
    for entry in entries:
        key, eq, value = entry.partition("=")
        if not eq:
            problem = f"env: {entry!r} has no '='; give KEY=VALUE, {EXAMPLE}"
        elif not KEY.match(key):
            problem = f"env: {key!r} (in {entry!r}) is not a variable name (letters, digits, _; not a digit first); {EXAMPLE}"
        elif key in out:
            problem = f"env: {key} is given twice ({key}={out[key]!r} and {entry!r}); give it once"
        elif key in OWNED or key.startswith(("SIMCLUSTER_", "TORCHELASTIC_")):
            owner = OWNED.get(key, "the launcher's own options" if key.startswith("SIMCLUSTER_") else "torchrun")
            problem = f"env: {key} is set by the cluster ({owner}) on every rank; drop it from --env"
        else:
            out[key] = value
            continue
        e = ConfigError(problem)
        e.field = "env"
        raise e
    return tuple(out.items())
