"""PyTorch's multi-node DDP tutorial as GPU programs write it, with issue 53's GPU idioms: ``model.to(local_rank)``
(an int), a TorchScript function over torch.zeros, ``import torch.distributed.optim``, a Megatron-style CUDA
RNG tracker over ``torch.cuda.default_generators``, the per-device ordinal checks. Each rank prints one line a step.

    python -m launcher up --nodes 2 --nproc-per-node 2 --mount-code --script tests/gpu_ddp_tutorial.py -- --steps 3
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.optim  # noqa: F401 - scripts functional optimizers at import
from torch.nn.parallel import DistributedDataParallel as DDP


@torch.jit.script
def bias_init(n: int) -> torch.Tensor:
    return torch.zeros(n) + 0.01


class RngTracker:
    """A named CUDA RNG state forked around a region (the model-parallel core library's tracker, reduced)."""

    def __init__(self, seed: int):
        before = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(seed)
        self.state = torch.cuda.get_rng_state()
        torch.cuda.set_rng_state(before)

    def fork(self):
        tracker = self

        class Fork:
            def __enter__(self):
                self.before = torch.cuda.get_rng_state()
                idx = torch.cuda.current_device()
                torch.cuda.default_generators[idx].set_state(tracker.state)

            def __exit__(self, *exc):
                tracker.state = torch.cuda.get_rng_state()
                torch.cuda.set_rng_state(self.before)
        return Fork()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    steps = parser.parse_args().steps
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    try:
        torch.cuda.get_device_name(torch.cuda.device_count() + 5)
        ordinal = "answered"
    except AssertionError as e:
        ordinal = str(e)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(local_rank)
    with torch.no_grad():
        model[0].bias.copy_(bias_init(32))
    tracker = RngTracker(1234 + rank)
    with tracker.fork():
        dropout_mask = (torch.rand(32, device="cuda") > 0.1).float()  # each rank its own, repeatable
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator(device="cuda").manual_seed(7)
    x, y = torch.randn(64, 16, device="cuda", generator=g), torch.randn(64, 1, device="cuda", generator=g)
    mask = "".join(str(int(v)) for v in dropout_mask[:16].tolist())  # each rank's own draw
    for step in range(1, steps + 1):
        opt.zero_grad()
        h = torch.relu(ddp.module[0](x)) * dropout_mask
        loss = torch.nn.functional.mse_loss(ddp.module[2](h), y) if step < 0 else torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.6f} gpu {torch.cuda.get_device_name()} ordinal "
              f"'{ordinal}' generators {len(torch.cuda.default_generators)} mask {mask}\n",
              end="", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
