"""Faults and network conditions: `launcher chaos`, simcluster.run(chaos=...), --inter-node-bandwidth.

    python -c "from simcluster.launcher.drills.faults import Kill; print(Kill('node-1', at_step=2))"
"""
