"""Entry point of a checkout: ``python -m launcher {generate,up,down,status,logs,chaos,report,build,compare,plan,project} --help``.

    python -m launcher generate --mesh 2x2x2          # writes compose/mesh-2x2x2.yml
    python -m launcher up --mesh 2x2x2 --steps 50     # build if needed, run, summarise, down

The same program as ``python -m simcluster`` and the installed ``simcluster`` command. This folder
is the host side (torch-free); its code is imported under its one name, ``simcluster.launcher``
(simcluster/launcher is this folder), so that a user's own ``launcher.py`` never shadows it. The
floors and which folder imports which: docs/layout.md.
"""
import sys

from simcluster.launcher.cli import main

sys.exit(main())
