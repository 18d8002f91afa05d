"""Entry point: python -m launcher {generate,up,down,status,logs} --help"""
import sys

from simcluster.launcher.cli import main

sys.exit(main())
