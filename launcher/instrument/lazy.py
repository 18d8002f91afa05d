"""Run a function right after a module is first imported, without importing it (stdlib only).

    python -c "from simcluster.launcher.instrument.lazy import when_imported; when_imported('json', lambda m: print('json', m.dumps(1))); import json"

The instruments start before the user's code has imported torch (``boot/sitecustomize.py``);
importing it there would cost every rank of a torch-free job seconds. ``when_imported`` puts a
finder first on ``sys.meta_path`` that lets the regular finders locate the module and wraps its
loader: once the module has executed, the callback runs with it, once. A module already imported
runs the callback at once.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, callbacks):
        self.inner, self.callbacks = inner, callbacks

    def __getattr__(self, name):  # get_resource_reader, is_package, get_source ... of the real loader
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for cb in self.callbacks:
            cb(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.pending: dict[str, list[Callable]] = {}

    def find_spec(self, name, path=None, target=None):
        callbacks = self.pending.pop(name, None)
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, callbacks)
                return spec
        return None


_FINDER = _Finder()


def when_imported(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once module ``name`` (dotted) has been imported and executed.

    The callback runs inside the import statement that first imports ``name``; an exception in it
    propagates there, so callbacks catch their own.
    """
    if name in sys.modules:
        callback(sys.modules[name])
        return
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _FINDER.pending.setdefault(name, []).append(callback)
