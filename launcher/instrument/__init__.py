"""Instruments loaded into the ranks of the user's own code.

    python -c "from simcluster.launcher.instrument.spec import Instruments; print(Instruments())"
"""
