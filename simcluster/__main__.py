"""Entry point: ``python -m simcluster {generate,up,down,status,logs,chaos,report} --help`` (the `simcluster` command).

    python -m simcluster --help
"""
import sys

from simcluster.launcher.cli import main

sys.exit(main())
