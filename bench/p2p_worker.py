"""One side of the two-container send/recv microbenchmark (run inside a container by bench/netshape.py).

    python bench/p2p_worker.py --rank 0 --master bench-a --port 29500 --mbytes 8 --repeats 3 --wait-for /out/ready

Waits for ``--wait-for`` (written once the network is shaped), joins a 2-rank gloo group
(rank 0 hosts the TCPStore), then rank 0 sends a float32 tensor of ``--mbytes`` MB to rank 1
``--repeats`` times, each acknowledged by a 1-element recv, and prints one JSON line:
{"bytes": B, "seconds": [s, ...], "mbit_s": [B*8/s/1e6, ...]} (rank 1 prints nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--master", required=True)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--mbytes", type=float, default=8.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--wait-for", default=None)
    a = p.parse_args()
    while a.wait_for and not os.path.exists(a.wait_for):
        time.sleep(0.1)
    store = dist.TCPStore(a.master, a.port, 2, a.rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=2, timeout=timedelta(seconds=600))
    n = int(a.mbytes * 1e6 / 4)
    x, ack = torch.ones(n), torch.zeros(1)
    dist.barrier()
    secs = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        if a.rank == 0:
            dist.send(x, 1)
            dist.recv(ack, 1)
        else:
            dist.recv(x, 0)
            dist.send(ack, 0)
        secs.append(time.perf_counter() - t0)
    if a.rank == 0:
        b = n * 4
        print(json.dumps({"bytes": b, "seconds": secs, "mbit_s": [b * 8 / s / 1e6 for s in secs]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
