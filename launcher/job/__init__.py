"""The job: what runs on the cluster, described once and frozen (launch.py), built from every
surface's input by one checked constructor, and the host paths it names (files.py).

    python -c "from simcluster.launcher.job.launch import NodeOptions; print(NodeOptions())"
"""
