"""The simulated GPU of each rank of the user's code (cuda -> cpu, nccl -> gloo): see install.py.

    python -c "from simcluster.launcher.instrument.gpu.install import SUMMARY; print(SUMMARY)"
"""
