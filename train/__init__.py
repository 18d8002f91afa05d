"""3D-parallel (pp x dp x tp) training of a Llama-style decoder LM with torch.distributed.

    torchrun --nproc-per-node 8 -m train --mesh 2x2x2 --model small --steps 300
    python -m train --mesh 1x1x1 --model tiny --steps 20      # one process
"""

# Modules a launcher may import once per node before forking the ranks (launcher/container/forkrun.py):
# the rank's own imports after ``train.__main__`` parses its flags.
PRELOAD = ("simcluster.train.trainer",)
