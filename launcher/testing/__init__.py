"""Testing your code on the simulated cluster from pytest: the plugin (plugin.py) behind ``pip install "simcluster[pytest]"``.

    python -m pytest -q -p simcluster.launcher.testing.plugin tests/test_plugin.py
"""
