#!/usr/bin/env python3
"""Build the dsv4kit wheel on the control machine, reproducibly; print one JSON object.

Usage: build_dsv4kit_wheel.py SOURCE_DIR OUT_DIR

The package sources are copied to a scratch directory first (the checkout is never written to:
no build/ or egg-info appear there, and concurrent builds do not collide). SOURCE_DATE_EPOCH
fixes the timestamps inside the zip, so the same sources give byte-identical wheels and a second
provisioning run changes nothing on the box. Prints {"path", "name", "sha256"}.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Where setuptools finds the package directories (pyproject's [tool.setuptools] package-dir).
FALLBACK_PACKAGE_DIRS = ["toolkit", "kernels", "validation"]
TOP_FILES = ["pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in"]
FIXED_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip can hold
BUILD_TIMEOUT_S = 600  # a pure-Python wheel builds in seconds; a hang must not stall the play


def package_dirs(source):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return FALLBACK_PACKAGE_DIRS
    with open(os.path.join(source, "pyproject.toml"), "rb") as fh:
        config = tomllib.load(fh)
    mapping = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return sorted({path.split("/")[0] for path in mapping.values()}) or FALLBACK_PACKAGE_DIRS


def main(source, out_dir):
    source = os.path.abspath(source)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dsv4kit-wheel-") as scratch:
        tree = os.path.join(scratch, "src")
        os.makedirs(tree)
        for name in TOP_FILES:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copy2(os.path.join(source, name), tree)
        for name in package_dirs(source):
            shutil.copytree(os.path.join(source, name), os.path.join(tree, name),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        built = os.path.join(scratch, "dist")
        env = dict(os.environ, SOURCE_DATE_EPOCH=FIXED_EPOCH, PIP_DISABLE_PIP_VERSION_CHECK="1")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                 "-q", "--wheel-dir", built, tree],
                capture_output=True, text=True, env=env, cwd=scratch, timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"pip wheel did not finish within {BUILD_TIMEOUT_S} s\n")
            return 1
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            return proc.returncode
        wheels = [w for w in os.listdir(built) if w.endswith(".whl")]
        if len(wheels) != 1:
            sys.stderr.write(f"expected one wheel, got {wheels}\n")
            return 1
        name = wheels[0]
        staged = os.path.join(out_dir, f".{name}.tmp")
        shutil.copyfile(os.path.join(built, name), staged)
        os.replace(staged, os.path.join(out_dir, name))
    with open(os.path.join(out_dir, name), "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    print(json.dumps({"path": os.path.join(out_dir, name), "name": name, "sha256": digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
