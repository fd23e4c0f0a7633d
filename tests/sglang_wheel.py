"""The real SGLang 0.5.23 wheel for tests, downloaded once and reused; venvs that can import it.

Cache: ``$DSV4KIT_CACHE`` (default ``~/.cache/dsv4kit``):

* ``wheels/sglang-0.5.23-*.whl``: ``pip download --no-deps sglang==0.5.23`` (once, 39 MB);
* ``sglang-0.5.23-site/``: the wheel unpacked (``sglang/`` and its ``.dist-info``), put on
  ``PYTHONPATH`` so ``importlib.metadata`` sees a real SGLang 0.5.23 distribution;
* ``bench-client-venv-<key>/``: :func:`client_venv`, per test venv (the key hashes its path).

SGLang's import chain (transformers, orjson, ...) is not installed here: it is the
``sglang-chain`` extra of pyproject.toml, part of ``.[test]``, so the test venv has it. Venvs for
the tests are made without the system site-packages and see the test venv's packages through a
"farm" directory of symlinks to each of them except dsv4kit and sglang (so the editable dsv4kit
of this checkout and its entry point are invisible, and each venv chooses its SGLang).

Every cache entry is built in a temporary sibling and renamed into place, under a file lock, so
an interrupted or concurrent run never leaves half an entry.
"""

from __future__ import annotations

import contextlib
import functools
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.23"

# Left out of the farm: our own package (each venv installs the wheel under test, or not) and any
# SGLang (the tests choose which copy is on PYTHONPATH).
_FARM_EXCLUDE_PREFIXES = ("dsv4kit", "__editable__", "sglang")


def cache_dir() -> Path:
    root = Path(os.environ.get("DSV4KIT_CACHE") or Path.home() / ".cache" / "dsv4kit")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def _locked(name: str):
    with open(cache_dir() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
                           f"{(done.stderr or done.stdout)[-3000:]}")
    return done


def sglang_wheel() -> Path:
    """The cached ``sglang-0.5.23-*.whl``; downloaded with pip the first time."""
    wheels = cache_dir() / "wheels"
    with _locked("sglang-wheel"):
        found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if found:
            return found[0]
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                  f"sglang=={SGLANG_VERSION}", "-d", tmp], timeout=600)
            got = sorted(Path(tmp).glob(f"sglang-{SGLANG_VERSION}-*.whl"))
            if not got:
                raise RuntimeError(f"pip download sglang=={SGLANG_VERSION} wrote no wheel")
            final = wheels / got[0].name
            os.replace(got[0], final)
            return final


def sglang_site() -> Path:
    """A directory holding the unpacked wheel: ``sglang/`` and ``sglang-0.5.23.dist-info/``."""
    site = cache_dir() / f"sglang-{SGLANG_VERSION}-site"
    wheel = sglang_wheel()
    with _locked("sglang-site"):
        if (site / ".complete").is_file():
            return site
        tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".sglang-site-"))
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        (tmp / ".complete").write_text(wheel.name + "\n")
        if site.exists():
            shutil.rmtree(site)
        os.replace(tmp, site)
        return site


def sglang_variant(dest: Path, edits: dict | None = None, version: str | None = None) -> Path:
    """A copy of :func:`sglang_site` made of symlinks, with some files changed.

    ``edits`` maps a path relative to the site (``sglang/...py``) to a function from the file's
    text to its new text; ``version`` rewrites the distribution's version (METADATA and the
    dist-info directory name), as if another SGLang release were installed.
    """
    site = sglang_site()
    edits = dict(edits or {})
    for src_dir, dirs, files in os.walk(site):
        rel = Path(src_dir).relative_to(site)
        out_dir = dest / rel
        if version and rel.parts and rel.parts[0].endswith(".dist-info"):
            out_dir = dest / f"sglang-{version}.dist-info" / Path(*rel.parts[1:])
        out_dir.mkdir(parents=True, exist_ok=True)
        # __pycache__ becomes a real directory of symlinks: the stock bytecode stays valid for
        # the unchanged (symlinked) sources, and Python replaces a link, never the stock file,
        # when it recompiles an edited one.
        for name in files:
            src = Path(src_dir) / name
            key = str(rel / name)
            if key in edits:
                (out_dir / name).write_text(edits.pop(key)(src.read_text()))
            elif version and rel.parts and rel.parts[0].endswith(".dist-info") and name == "METADATA":
                text = src.read_text().replace(f"\nVersion: {SGLANG_VERSION}\n", f"\nVersion: {version}\n", 1)
                (out_dir / name).write_text(text)
            else:
                (out_dir / name).symlink_to(src)
    if edits:
        raise KeyError(f"files to edit not found in the SGLang wheel: {sorted(edits)}")
    return dest


def system_farm(dest: Path) -> Path:
    """Symlinks to every entry of this interpreter's (the test venv's) site-packages except dsv4kit
    and sglang.

    ``.pth`` files are left out too: they are only honoured in site directories, and this one is
    added through a ``.pth`` line.
    """
    purelib = Path(sysconfig.get_paths()["purelib"])
    dest.mkdir(parents=True, exist_ok=True)
    for entry in purelib.iterdir():
        lowered = entry.name.lower()
        if lowered.startswith(_FARM_EXCLUDE_PREFIXES) or lowered.endswith(".pth"):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def make_venv(dest: Path, extra_paths=()) -> Path:
    """A venv without pip or system site-packages; ``extra_paths`` go into a ``.pth`` file.

    Install into it with :func:`pip_into` (this interpreter's pip, ``--python``)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(dest)], timeout=120)
    python = dest / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   timeout=60).stdout.strip()
    if extra_paths:
        Path(purelib, "dsv4kit_test_paths.pth").write_text(
            "".join(f"{p}\n" for p in extra_paths))
    return python


def pip_into(python: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
                 *args], timeout=timeout)


def build_dsv4kit_wheel(dest: Path) -> Path:
    """``pip wheel --no-deps`` of this checkout (sources copied first; see dsv4kit.core.wheelbuild)."""
    from dsv4kit.core.wheelbuild import build_wheel

    return build_wheel(dest).path


@functools.lru_cache(maxsize=None)
def session_wheel(base: Path) -> Path:
    """The dsv4kit wheel of this checkout, built once per test session under ``base``."""
    return build_dsv4kit_wheel(base / "dsv4kit-wheel")


@functools.lru_cache(maxsize=None)
def session_venv(base: Path, name: str, with_dsv4kit: bool = True, with_sglang_deps: bool = True) -> Path:
    """A venv under ``base`` (once per session and name), returning its python.

    ``with_sglang_deps``: it sees the test venv's packages (the farm: torch, triton, SGLang's
    import chain), as an SGLang venv would; otherwise it is bare (standard library only).
    ``with_dsv4kit``: the wheel of this checkout is installed into it with ``pip install --no-deps``.
    """
    paths = [_session_farm(base)] if with_sglang_deps else []
    python = make_venv(base / name, paths)
    if with_dsv4kit:
        pip_into(python, "install", "-q", "--no-deps", str(session_wheel(base)))
    return python


@functools.lru_cache(maxsize=None)
def _session_farm(base: Path) -> Path:
    return system_farm(base / "system-farm")


#: Compiled packages SGLang's import chain reaches that the bench client never runs, stood in for
#: in the client venv (tests/standins.py): the PyPI torchvision needs a CUDA torch, and
#: ``sglang.srt.configs`` imports ``torchvision.transforms`` at import time.
CLIENT_STANDINS = ("torchvision",)
_HERE = Path(__file__).resolve().parent


def client_venv() -> Path:
    """A venv (returned as its directory) with the real ``sglang.benchmark.serving`` client.

    SGLang 0.5.23 from the cached wheel, ``pip install --no-deps``; its import chain is the test
    venv's own packages (the farm: torch 2.13 CPU, transformers, ...), never a second torch;
    :data:`CLIENT_STANDINS` for compiled packages. Built once per test venv (about a minute) and
    cached in :func:`cache_dir` (about 220 MB: the installed SGLang); checked with ``--help``.
    ``$DSV4KIT_BENCH_CLIENT_VENV`` points at a prebuilt one instead.
    """
    override = os.environ.get("DSV4KIT_BENCH_CLIENT_VENV")
    if override:
        return Path(override)
    # Per test venv and its package set (the dist-info names carry the versions).
    packages = sorted(p.name for p in Path(sysconfig.get_paths()["purelib"]).iterdir())
    key = hashlib.sha256("\n".join([SGLANG_VERSION, sys.prefix, sys.version, *CLIENT_STANDINS,
                                    (_HERE / "standins.py").read_text(), *packages]).encode()).hexdigest()[:12]
    entry = cache_dir() / f"bench-client-venv-{key}"
    wheel = sglang_wheel()
    with _locked("bench-client-venv"):
        if (entry / ".complete").is_file():
            return entry / "venv"
        tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".bench-client-venv-"))
        try:
            _build_client_venv(tmp, wheel)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / ".complete").write_text(f"{key}\n{sys.prefix}\n")
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
        _drop_stale_client_venvs(keep=entry)
        return entry / "venv"


def _drop_stale_client_venvs(keep: Path) -> None:
    """Older client venvs of this test venv, and those whose test venv is gone (dangling links)."""
    for entry in cache_dir().glob("bench-client-venv-*"):
        if entry == keep:
            continue
        stamp = entry / ".complete"
        mine = stamp.is_file() and stamp.read_text().splitlines()[1:] == [sys.prefix]
        farm = entry / "test-packages"
        links = list(farm.iterdir()) if farm.is_dir() else []
        if mine or not links or any(not link.exists() for link in links):
            shutil.rmtree(entry, ignore_errors=True)


def _build_client_venv(tmp: Path, wheel: Path) -> None:
    system_farm(tmp / "test-packages")
    python = make_venv(tmp / "venv")
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        timeout=60).stdout.strip())
    # Relative .pth lines are resolved against the site directory: the entry is renamed into place.
    (purelib / "dsv4kit_test_packages.pth").write_text(os.path.relpath(tmp / "test-packages", purelib) + "\n")
    (purelib / "dsv4kit_test_standins.py").write_text((_HERE / "standins.py").read_text())
    (purelib / "dsv4kit_test_standins.pth").write_text(
        f"import dsv4kit_test_standins; dsv4kit_test_standins.install({CLIENT_STANDINS!r})\n")
    pip_into(python, "install", "-q", "--no-deps", str(wheel), timeout=900)
    _run([str(python), "-m", "sglang.benchmark.serving", "--help"], timeout=600,
         env={**os.environ, "HF_HUB_OFFLINE": "1"})
