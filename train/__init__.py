"""3D-parallel (pp x dp x tp) training of a Llama-style decoder LM with torch.distributed.

    torchrun --nproc-per-node 8 -m train --mesh 2x2x2 --model small --steps 300
    python -m train --mesh 1x1x1 --model tiny --steps 20      # one process
"""
