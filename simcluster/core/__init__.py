"""simcluster.core: the floor both sides stand on, the facts the host launcher (launcher/) and the
torch trainer (train/) share: errors, the rank layout, units, the trainer's Config and its flags, the
run folder's records, the hang contract, the hardware table. It imports neither torch nor train/ nor
launcher/ (tests/test_imports.py); docs/layout.md names each module.

    python -m bench.imports
"""
