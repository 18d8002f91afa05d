"""Wiring probe: run in place of ``-m train`` to test the rendezvous, ranks and gloo links.

    python -m launcher up --mesh 2x2x2 --module launcher.container.probe --mount-code
    torchrun --nproc-per-node 2 -m launcher.container.probe          # on a host with torch

Each rank joins the gloo process group (env:// from torchrun), prints one line
``probe rank=R local_rank=L world_size=W host=H group_rank=G ... t_ready=...``
(UNIX seconds at start, after import torch, after init_process_group), all-reduces its rank and
checks the sum is W*(W-1)/2, then exits 0 (1 on a wrong sum). Train flags are ignored.
Env PROBE_FAIL_RANK=R makes rank R exit 3 instead of joining the all_reduce (failure drill).
"""
from __future__ import annotations

import os
import socket
import sys
import time

T_START = time.time()


def main() -> int:
    import torch
    import torch.distributed as dist

    t_torch = time.time()
    dist.init_process_group("gloo")
    t_ready = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"probe rank={rank} local_rank={os.environ.get('LOCAL_RANK')} world_size={world} "
          f"host={socket.gethostname()} group_rank={os.environ.get('GROUP_RANK')} "
          f"master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
          f"t_start={T_START:.3f} t_torch={t_torch:.3f} t_ready={t_ready:.3f}", flush=True)
    if os.environ.get("PROBE_FAIL_RANK") == str(rank):  # failure drill: this rank dies before all_reduce
        print(f"probe rank={rank} failing on purpose (PROBE_FAIL_RANK)", flush=True)
        return 3
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    expected = world * (world - 1) / 2
    ok = value.item() == expected
    print(f"probe rank={rank} all_reduce={value.item():g} expected={expected:g} {'ok' if ok else 'WRONG'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
