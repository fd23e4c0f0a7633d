"""SGLang 0.5.23's own kernel modules, loaded unmodified, so validation can run them beside ours.

Where SGLang 0.5.23 is installed (the box), each module is imported from it.

Where it cannot be installed (a benchmark GPU without SGLang's dependency tree), the module file
is executed from an unpacked 0.5.23 wheel: ``DSV4KIT_SGLANG_SOURCE`` names the directory that
holds its ``sglang/`` folder. The files import a few SGLang utility symbols at their top; those,
and only those, are stood in for while the file loads (``STAND_INS``), then ``sys.modules`` is
restored. The indexer's torch fallback lives in a module whose imports pull in the whole server,
so that one function is compiled from the wheel's file on its own (``load_function``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from typing import Callable

SGLANG_VERSION = "0.5.23"
SOURCE_ENV = "DSV4KIT_SGLANG_SOURCE"


class StockUnavailable(RuntimeError):
    """SGLang's implementation cannot be loaded here; the message says why."""


class _EnvVar:
    """Stand-in for one ``sglang.srt.environ.envs`` entry: ``.get()`` reads the environment."""

    def __init__(self, name: str, default: str):
        self.name, self.default = name, default

    def get(self) -> str:
        return os.environ.get(self.name, self.default)


def _stand_ins() -> dict[str, dict[str, object]]:
    """Module -> the symbols the loaded files import from it (the CUDA build's values)."""
    return {
        # is_hip / is_gfx95_supported: False on CUDA (what SGLang's checks return there).
        "sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
        # is_fp8_fnuz: False on CUDA (fp8 is e4m3fn).
        "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
        # envs.SGLANG_SM120_FLASHMLA_BACKEND, read once when flash_mla_sm120 is imported;
        # SGLang's default is "flashinfer".
        "sglang.srt.environ": {"envs": types.SimpleNamespace(
            SGLANG_SM120_FLASHMLA_BACKEND=_EnvVar("SGLANG_SM120_FLASHMLA_BACKEND", "flashinfer"))},
    }


def installed_version():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def origin() -> str:
    """Where stock modules come from here: ``installed``, ``wheel:<dir>``, or raise why neither."""
    version = installed_version()
    if version is not None:
        if version.split("+", 1)[0] != SGLANG_VERSION:
            raise StockUnavailable(f"SGLang {version} is installed, these comparisons need "
                                   f"{SGLANG_VERSION}")
        return "installed"
    source = os.environ.get(SOURCE_ENV)
    if not source:
        raise StockUnavailable(f"SGLang is not installed and {SOURCE_ENV} is not set "
                               "(the directory of an unpacked sglang 0.5.23 wheel)")
    if not os.path.isdir(os.path.join(source, "sglang")):
        raise StockUnavailable(f"{SOURCE_ENV}={source} holds no sglang/ folder")
    return f"wheel:{source}"


def _source_file(source: str, dotted: str) -> str:
    path = os.path.join(source, *dotted.split(".")) + ".py"
    if not os.path.isfile(path):
        raise StockUnavailable(f"{path} is missing from the unpacked wheel")
    return path


def _wheel_module(source: str, dotted: str) -> types.ModuleType:
    """Execute one module file of the wheel with the stand-ins present only while it loads."""
    path = _source_file(source, dotted)
    stand_ins = _stand_ins()
    packages = set()
    for name in [dotted, *stand_ins]:
        parts = name.split(".")
        packages.update(".".join(parts[:i]) for i in range(1, len(parts)))
    touched = packages | set(stand_ins) | {dotted}
    saved = {name: sys.modules.get(name) for name in touched}
    try:
        for name in sorted(packages):
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(source, *name.split("."))]
            sys.modules[name] = package
        for name, symbols in stand_ins.items():
            module = types.ModuleType(name)
            module.__dict__.update(symbols)
            module.__dsv4kit_stand_in__ = True
            sys.modules[name] = module
        spec = importlib.util.spec_from_file_location(dotted, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[dotted] = module
        spec.loader.exec_module(module)
        return module
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


_MODULES: dict[str, types.ModuleType] = {}


def load_module(dotted: str) -> types.ModuleType:
    """SGLang's module ``dotted`` (e.g. ``sglang.kernels.ops.attention.flash_mla_sm120_triton``)."""
    if dotted not in _MODULES:
        where = origin()
        try:
            if where == "installed":
                _MODULES[dotted] = importlib.import_module(dotted)
            else:
                _MODULES[dotted] = _wheel_module(where.split(":", 1)[1], dotted)
        except StockUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a missing dependency (tilelang, flash_mla...)
            raise StockUnavailable(f"{dotted} does not import ({type(exc).__name__}: "
                                   f"{str(exc)[:120]})") from exc
    return _MODULES[dotted]


def load_function(dotted: str, name: str, namespace: Callable[[], dict]) -> Callable:
    """One function of SGLang's module ``dotted``.

    Installed: the module's attribute. From the wheel: the function's own definition, compiled
    from the wheel's file unmodified, with ``namespace()`` as its globals (for a module whose
    top-level imports need the whole server).
    """
    where = origin()
    if where == "installed":
        try:
            return getattr(importlib.import_module(dotted), name)
        except Exception as exc:  # noqa: BLE001
            raise StockUnavailable(f"{dotted}.{name} does not import ({type(exc).__name__}: "
                                   f"{str(exc)[:120]})") from exc
    path = _source_file(where.split(":", 1)[1], dotted)
    with open(path) as fh:
        tree = ast.parse(fh.read(), filename=path)
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    if not found:
        raise StockUnavailable(f"{path} defines no function {name}")
    scope = dict(namespace())
    scope["__name__"] = dotted
    exec(compile(ast.Module(body=found, type_ignores=[]), path, "exec"), scope)  # noqa: S102
    return scope[name]
