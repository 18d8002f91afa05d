"""Where a node's ranks keep the code torch.compile builds: a folder of the run folder, since /tmp is
a noexec tmpfs in every container.

    python -c "from simcluster.launcher.container.compile_cache import cache_env; print(cache_env({}, '/runs/x', 'node-0'))"

inductor writes its compiled kernels (a C++ shared object a CPU graph loads) under
``TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_USER``) and Triton its own under
``TRITON_CACHE_DIR`` (default ``~/.triton/cache``, and HOME is /tmp here). A container's /tmp is a
tmpfs that Docker mounts noexec (Compose's ``tmpfs:`` entry and a stack's tmpfs mount alike) under a
read-only root, so loading that object fails (``failed to map segment from shared object``). The
run folder is a bind mount that allows it: each node gets ``RUN_DIR/compile-cache/NODE/``, one per
node as each machine of a cluster has its own /tmp, kept across the launcher's restarts (a restart
compiles from the cache). A variable the job's environment already sets (``--env``) is left as it is.
"""
from __future__ import annotations

import os

CACHE_DIR = "compile-cache"  # under the run folder
CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def cache_env(env: dict, run_dir: str | None, node: str) -> dict:
    """env with each compile cache variable set to ``run_dir/compile-cache/node/<kind>`` where env
    lacks it (the folders are made by inductor and Triton when they first write); env unchanged
    without a run folder. Returns env (changed in place)."""
    if not run_dir:
        return env
    for key, kind in CACHES.items():
        env.setdefault(key, os.path.join(run_dir, CACHE_DIR, node, kind))
    return env
