"""The real SGLang 0.5.23 wheel for tests, downloaded once and reused; venvs that can import it.

Cache: ``$DSV4KIT_CACHE`` (default ``~/.cache/dsv4kit``):

* ``wheels/sglang-0.5.23-*.whl``: ``pip download --no-deps sglang==0.5.23`` (once);
* ``sglang-0.5.23-site/``: the wheel unpacked (``sglang/`` and its ``.dist-info``), put on
  ``PYTHONPATH`` so ``importlib.metadata`` sees a real SGLang 0.5.23 distribution;
* ``rollout-deps-<hash>/``: the light third-party packages SGLang's import chain of the target
  modules needs and this machine lacks (``pip install --no-deps --target``, pinned below).

Venvs for the tests are made without the system site-packages (so the editable dsv4kit of this
checkout and its entry point are invisible) and see the system's torch/triton/numpy through a
"farm" directory of symlinks to every system package except dsv4kit and sglang.

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

# What importing sglang.srt.plugins and the three target modules needs beyond this machine's
# base image (numpy, scipy, pydantic, requests, regex, orjson, ipython, ...) and what .ci/run
# installs (torch 2.13 CPU with its dependencies, triton, typer with rich), pinned to what SGLang
# 0.5.23 pins or what resolved when this list was made. Installed with --no-deps: nothing here may pull
# another torch.
RUNTIME_DEPS = (
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "anyio==4.16.0",
    "apache-tvm-ffi==0.1.11", "click==8.5.1", "compressed-tensors==0.18.0", "dill==0.4.1",
    "einops==0.8.2", "frozenlist==1.8.0", "gguf==0.19.0", "h11==0.16.0", "hf-xet==1.8.0",
    "httpcore==1.0.9", "httpcore2==2.16.2", "httpx==0.28.1", "httpx2==2.16.2",
    "huggingface-hub==2.4.0", "idna==3.20", "loguru==0.7.3", "msgspec==0.23.0",
    "multidict==7.2.1", "openai==2.8.0", "partial-json-parser==0.2.1.1.post7", "pillow==13.0.0",
    "propcache==0.5.4", "psutil==7.2.2", "pybase64==1.5.1", "pyzmq==27.3.0", "safetensors==0.8.0",
    "sentencepiece==0.2.1", "starlette==1.10.0", "tokenizers==0.23.3", "tqdm==4.70.1",
    "transformers==5.19.0", "truststore==0.10.5", "typing-extensions==4.16.0", "yarl==1.25.1",
)

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


def runtime_deps() -> Path:
    """A ``--target`` directory with :data:`RUNTIME_DEPS` (built once per pin set)."""
    digest = hashlib.sha256("\n".join(RUNTIME_DEPS + (sys.version,)).encode()).hexdigest()[:12]
    target = cache_dir() / f"rollout-deps-{digest}"
    with _locked("rollout-deps"):
        if (target / ".complete").is_file():
            return target
        tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".rollout-deps-"))
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
              "--disable-pip-version-check", "--target", str(tmp), *RUNTIME_DEPS], timeout=900)
        (tmp / ".complete").write_text("\n".join(RUNTIME_DEPS) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        for stale in cache_dir().glob("rollout-deps-*"):  # built for an older pin set
            if stale != target:
                shutil.rmtree(stale, ignore_errors=True)
        return target


def system_farm(dest: Path) -> Path:
    """Symlinks to every entry of this interpreter's site-packages except dsv4kit and sglang.

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
    """``pip wheel --no-deps`` of this checkout (sources copied first; see dsv4kit.wheelbuild)."""
    from dsv4kit.wheelbuild import build_wheel

    return build_wheel(dest).path


@functools.lru_cache(maxsize=None)
def session_wheel(base: Path) -> Path:
    """The dsv4kit wheel of this checkout, built once per test session under ``base``."""
    return build_dsv4kit_wheel(base / "dsv4kit-wheel")


@functools.lru_cache(maxsize=None)
def session_venv(base: Path, name: str, with_dsv4kit: bool = True, with_sglang_deps: bool = True) -> Path:
    """A venv under ``base`` (once per session and name), returning its python.

    ``with_sglang_deps``: it sees the system packages (the farm) and :func:`runtime_deps`, as an
    SGLang venv would; otherwise it is bare (standard library only). ``with_dsv4kit``: the wheel
    of this checkout is installed into it with ``pip install --no-deps``.
    """
    paths = [runtime_deps(), _session_farm(base)] if with_sglang_deps else []
    python = make_venv(base / name, paths)
    if with_dsv4kit:
        pip_into(python, "install", "-q", "--no-deps", str(session_wheel(base)))
    return python


@functools.lru_cache(maxsize=None)
def _session_farm(base: Path) -> Path:
    return system_farm(base / "system-farm")
