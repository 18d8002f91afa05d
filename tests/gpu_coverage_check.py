"""Each name of the simulated GPU's coverage table does what its verdict says (run by
tests/test_gpu_api.py): torch is imported bare, every table name's object noted, the simulated GPU
installed as a rank installs it, then each name checked. Prints one JSON list of mismatches.

    PYTHONPATH=. python tests/gpu_coverage_check.py
"""
import json
import sys
import types

import torch

from simcluster.launcher.instrument.gpu import coverage
from simcluster.launcher.instrument.gpu.install import install

before = {(m, n): getattr(coverage.module(m), n, None) for m in coverage.TABLE for n in coverage.verdicts(m)}
install(torch, 4, "h100-sxm")
bad = []


def refuses(obj, qualname: str) -> bool:
    try:
        obj() if callable(obj) else obj.size  # an object (the cuFFT plan cache): any attribute
    except RuntimeError as e:
        return ("simulated GPU does not have" in str(e) or "is a CUDA kernel" in str(e)) and "Fix: " in str(e)
    except Exception:  # noqa: BLE001
        return False
    return False


for m in coverage.TABLE:
    mod = coverage.module(m)
    for n, (verdict, _why) in coverage.verdicts(m).items():
        obj, old = getattr(mod, n, None), before[(m, n)]
        if isinstance(obj, types.ModuleType):
            targets = [getattr(obj, f) for f in coverage._own_names(obj)] if verdict == coverage.REFUSED else []
        else:
            targets = [obj]
        if verdict == coverage.REFUSED and not all(refuses(t, f"{m}.{n}") for t in targets):
            bad.append(f"{m}.{n}: {verdict} but does not refuse")
        elif verdict == coverage.TORCH and not isinstance(obj, types.ModuleType) and obj is not old:
            bad.append(f"{m}.{n}: {verdict} but replaced")
        elif verdict == coverage.REPLACED and not isinstance(obj, types.ModuleType) and obj is old:
            bad.append(f"{m}.{n}: {verdict} but torch's own")
json.dump(bad, sys.stdout)
