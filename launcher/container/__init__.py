"""The programs that run inside the containers (the trainer image), not on the host.

    python -m launcher.container.rendezvous --port 29400 --nnodes 2 --lost-after-s 24   # the rendezvous service
    python -m launcher.container.node --nnodes 2 --node-rank 0 ... -- TRAIN FLAGS       # one node: torchrun + heartbeat
    python -m simcluster.train.forkrun ... -m train ...                               # torchrun, ranks forked
    torchrun --nproc-per-node 2 -m launcher.container.probe                             # wiring probe

They need torch (the host launcher does not) and share the cluster's facts through
launcher/container/layout.py; everything else they are told by flags.
"""
