"""Stand-ins for compiled packages that a CPU test machine cannot load (e.g. the PyPI torchvision,
which needs a CUDA torch), imported by SGLang's modules at import time but never run by the tests.

A stand-in module answers any attribute with an inert placeholder. Used by tests/rollout_scenario.py
and, through a ``.pth`` line, by the bench client's venv (tests/sglang_wheel.py). Standard library
only: it is copied into venvs as a single file.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, key):
        return _Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _StandinModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self.__name__}.{item}")

    def __call__(self, *args, **kwargs):  # e.g. ``@tilelang.jit(...)`` once tilelang.jit is a module
        return _Placeholder(f"{self.__name__}()")


class _StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = frozenset(roots)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        module.__version__ = "0+standin"
        return module

    def exec_module(self, module):
        pass


def install(roots) -> None:
    """Answer every import of a module under one of ``roots`` with a stand-in (first on sys.meta_path)."""
    sys.meta_path.insert(0, _StandinFinder(roots))
