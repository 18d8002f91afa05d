"""Entry point: ``python -m simcluster {generate,up,down,status,logs,chaos,report} --help`` (the `simcluster` command)."""
import sys

from simcluster.launcher.cli import main

sys.exit(main())
