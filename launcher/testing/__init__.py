"""Testing your code on the simulated cluster from pytest: the plugin (plugin.py) behind ``pip install "simcluster[pytest]"``."""
