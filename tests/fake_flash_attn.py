"""flash-attn's source release and the CUDA toolkit's nvcc, stood in for (the flash_attn stage's tests).

``write_sdist`` writes a tiny ``flash_attn-<version>.tar.gz`` whose setup.py builds the way
flash-attn's does: it imports its build requirements from the venv (``--no-build-isolation``),
refuses to build unless FLASH_ATTENTION_FORCE_BUILD=TRUE (flash-attn would fetch a prebuilt wheel
from GitHub instead), reads the archs from FLASH_ATTN_CUDA_ARCHS, runs ``$CUDA_HOME/bin/nvcc`` on
its .cu sources once per arch with NVCC_THREADS, and compiles a real C extension
``flash_attn_2_cuda`` (a platform wheel) that reports the archs it was built for.
``write_prebuilt_wheel`` is what a package index also holds: a wheel of the same version built
elsewhere, for other archs. ``write_nvcc`` is nvcc: ``-V`` and compiling, or cicc crashing the
way it has on flash-attn's backward kernels for sm_120.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

SETUP_PY = '''\
import os
import subprocess
import sys
from pathlib import Path

import wheel  # noqa: F401  flash-attn's setup.py imports wheel's bdist_wheel: a build requirement
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

if os.environ.get("FLASH_ATTENTION_FORCE_BUILD") != "TRUE":
    sys.exit("error: FLASH_ATTENTION_FORCE_BUILD is not TRUE: flash-attn would download a prebuilt "
             "wheel for this torch and CUDA from GitHub instead of building")
ARCHS = os.environ.get("FLASH_ATTN_CUDA_ARCHS", "80;90;100;120")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")


class BuildCuda(build_ext):
    def run(self):
        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
        if not os.access(nvcc, os.X_OK):
            sys.exit(f"error: nvcc was not found at {nvcc} (CUDA_HOME={CUDA_HOME})")
        print(subprocess.run([nvcc, "-V"], check=True, capture_output=True, text=True).stdout, flush=True)
        jobs = int(os.environ["MAX_JOBS"])
        out = Path(self.build_temp)
        out.mkdir(parents=True, exist_ok=True)
        for arch in ARCHS.split(";"):
            for source in sorted(Path("csrc").glob("*.cu")):
                command = [nvcc, "-c", str(source), "-o", str(out / f"{source.stem}_sm{arch}.o"),
                           "-gencode", f"arch=compute_{arch},code=sm_{arch}",
                           "--threads", os.environ.get("NVCC_THREADS", "1")]
                print(f"[MAX_JOBS={jobs}] " + " ".join(command), flush=True)
                subprocess.run(command, check=True)
        super().run()


setup(
    name="flash_attn",
    version="@VERSION@",
    packages=["flash_attn"],
    ext_modules=[Extension("flash_attn_2_cuda", ["csrc/flash_api.c"],
                           define_macros=[("FA_ARCHS", '"' + ARCHS + '"')])],
    cmdclass={"build_ext": BuildCuda},
)
'''

FLASH_API_C = '''\
#include <Python.h>
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "flash_attn_2_cuda", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_flash_attn_2_cuda(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL) PyModule_AddStringConstant(m, "archs", FA_ARCHS);
    return m;
}
'''


def _package_files(version: str) -> dict[str, str]:
    return {
        "setup.py": SETUP_PY.replace("@VERSION@", version),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n",
        "flash_attn/__init__.py": f'__version__ = "{version}"\n',
        "csrc/flash_api.c": FLASH_API_C,
        "csrc/flash_fwd_hdim128_bf16_sm120.cu": "// forward kernel\n",
        "csrc/flash_bwd_hdim128_bf16_sm120.cu": "// backward kernel\n",
    }


def write_sdist(directory: Path, version: str) -> Path:
    """``directory/flash_attn-<version>.tar.gz``, flash-attn's source release stood in for."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"flash_attn-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in _package_files(version).items():
            data = text.encode()
            info = tarfile.TarInfo(f"flash_attn-{version}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def write_prebuilt_wheel(directory: Path, version: str, archs: str = "80;90") -> Path:
    """A wheel of the same version built elsewhere for ``archs`` (its flash_attn_2_cuda is Python)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"flash_attn-{version}-py3-none-any.whl"
    info = f"flash_attn-{version}.dist-info"
    files = {
        "flash_attn/__init__.py": f'__version__ = "{version}"\n',
        "flash_attn_2_cuda.py": f'archs = "{archs}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: elsewhere\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": "flash_attn\nflash_attn_2_cuda\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


NVCC = """#!/bin/sh
# nvcc stand-in: the version, and "compiling" a .cu file into the -o object.
case "$1" in -V|--version)
  echo "nvcc: NVIDIA (R) Cuda compiler driver"; echo "Cuda compilation tools, release {release}, V{release}.88"; exit 0;;
esac
out= src= prev=
for arg in "$@"; do
  [ "$prev" = -o ] && out=$arg
  case "$arg" in *.cu) src=$arg;; esac
  prev=$arg
done
{crash}echo "object of $src: $*" > "$out"
"""
# cicc's segfault on flash-attn's backward kernels for sm_120 (reported with CUDA 12.8/12.9).
CICC_CRASH = """case "$src $*" in *bwd*sm_120*)
  echo "nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)" >&2; exit 139;;
esac
"""


def write_nvcc(cuda_home: Path, release: str, *, cicc_crashes: bool = False) -> Path:
    """``cuda_home/bin/nvcc``: reports ``release``; with ``cicc_crashes`` it dies on sm_120 backward kernels."""
    nvcc = cuda_home / "bin/nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text(NVCC.format(release=release, crash=CICC_CRASH if cicc_crashes else ""))
    nvcc.chmod(0o755)
    return nvcc
