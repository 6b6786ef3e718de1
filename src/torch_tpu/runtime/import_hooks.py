"""Run code when another library's module is imported, without importing it ourselves.

torch_tpu adapts modules it must not import eagerly: ``accelerate.state`` (an optional
dependency) and ``torch._dynamo`` (seconds to import, and only needed by ``torch.compile``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``name`` through the other finders and calls ``callback`` once it has executed."""

    _loader = None  # the real loader, once found

    def __init__(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from finding us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self.callback(module)

    def __getattr__(self, name: str):
        # the rest of the loader protocol (get_source, is_package, get_resource_reader...)
        return getattr(self._loader, name)


def after_import(name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Call ``callback(module)`` for module ``name``: now if it is imported, else right after its
    first import finishes executing."""
    if name in sys.modules:
        callback(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
