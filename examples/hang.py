"""A program that hangs (or not) the way real 3D-parallel code does; the stall watch's test subject.

    torchrun --nproc-per-node 4 examples/hang.py --kind none --steps 2

--kind none: runs --steps steps and exits 0. At step --at (default 3), on a world of 4 or 8 ranks:
  skip        rank 1 skips the world all_reduce and waits on a recv from rank 0 instead
  recv-first  ranks 0 and 1 both recv from each other before sending
  shape       rank 1's all_reduce in its tensor-parallel group [0, 1] has another shape
  microbatch  the last pipeline stage (upper half of the ranks) runs one microbatch fewer
  busy        rank 1 spins in a Python loop while the others wait in the all_reduce
--start-delay S: the last rank sleeps S seconds before step 1, as a slow start-up would.
Every step: microbatches flow from the first stage (lower half of the ranks) to the last (send,
recv) and back, then a world all_reduce; rank pairs (2i, 2i+1) are tensor-parallel peers.
"""
import argparse
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="none", choices=("none", "skip", "recv-first", "shape", "microbatch", "busy"))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--at", type=int, default=3)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--start-delay", type=float, default=0.0, help="the last rank sleeps this long before step 1 "
                   "(a slow start-up, which is no stall)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    half = world // 2
    tp = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
    my_tp = tp[rank // 2]
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.0)  # one optimizer step per step: the instruments' step clock
    first = rank < half
    if rank == world - 1:
        time.sleep(a.start_delay)
    peer = rank + half if first else rank - half  # the same position in the other pipeline stage
    for step in range(1, a.steps + 1):
        bad = step == a.at
        x = torch.ones(8)
        dist.all_reduce(x, group=my_tp) if not (bad and a.kind == "shape" and rank == 1) \
            else dist.all_reduce(torch.ones(16), group=my_tp)
        n = a.microbatches - (1 if bad and a.kind == "microbatch" and not first else 0)
        for _ in range(n):
            if first:
                dist.send(x, peer)
                dist.recv(x, peer)
            else:
                dist.recv(x, peer)
                dist.send(x, peer)
        if bad and a.kind == "recv-first" and rank in (0, 1):
            dist.recv(x, 1 - rank)
            dist.send(x, 1 - rank)
        if bad and a.kind == "skip" and rank == 1:
            dist.recv(x, 0)
        elif bad and a.kind == "busy" and rank == 1:
            while True:
                sum(i * i for i in range(1000))
        else:
            dist.all_reduce(x)
        w.grad = torch.zeros(1)
        opt.step()
        if rank == 0:
            print(f"step {step} done", flush=True)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
