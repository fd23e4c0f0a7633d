"""The flash_attn stage runs for real, against flash-attn's source release and nvcc stood in for.

tests/fake_flash_attn.py gives a tiny flash-attn sdist at the pinned version (its setup.py builds
like flash-attn's: build requirements from the venv, FLASH_ATTN_CUDA_ARCHS, nvcc once per arch, a
real C extension ``flash_attn_2_cuda`` reporting its archs) next to a wheel of the same version
built elsewhere for other archs, as package indexes hold, and an nvcc that can crash like cicc did
on sm_120 backward kernels. The box is this machine over the loopback sshd (dsv4_gpu_present: true);
sglang_venv makes the venv with the build requirements first, then only flash_attn runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fake_flash_attn import write_nvcc, write_prebuilt_wheel, write_sdist
from tests.provision_inventory import TINY_PACKAGES, write_loopback_inventory

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PINS = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
VERSION = PINS["dsv4_flash_attn_version"]
# The build requirements the stand-in's setup.py imports, at versions this machine's index holds, and
# a current pip: Debian 12's Python 3.11 venv brings pip 23.0, whose --no-binary still bypassed pip's
# wheel cache; the pip of a box's venv (24 and later) reuses a cached build under --no-binary.
BUILD_REQUIREMENTS = ["pip==26.2.1", "setuptools==84.0.0", "wheel==0.48.0"]


class FlashAttnBox:
    """The loopback box's inventory, rewritten by ``write(**pins)``, and where the stage leaves things."""

    def __init__(self, root: Path, sshd):
        self.root, self.sshd = root, sshd
        self.prefix = root / "prefix"
        self.state = self.prefix / "var/lib/dsv4kit"
        self.cuda_home = self.prefix / "usr/local/cuda-stand-in"
        self.dist = root / "dist"
        write_sdist(self.dist, VERSION)
        write_prebuilt_wheel(self.dist, VERSION, archs="80;90")
        write_nvcc(self.cuda_home, PINS["dsv4_cuda_version"])
        self.inventory = self.write()

    def write(self, **pins) -> Path:
        role_vars = {
            "flash_attn_source_args": ["--no-index", "--find-links", str(self.dist)],
            "flash_attn_cuda_home": str(self.cuda_home),
            "flash_attn_build_poll": 1,
            # pip's own cache in scratch, as on a box that has built before (the role must not use it).
            "provision_task_environment": {"PIP_CACHE_DIR": str(self.root / "pip-cache")},
        }
        overrides = {"dsv4_gpu_present": True, "dsv4_venv_packages": [*TINY_PACKAGES, *BUILD_REQUIREMENTS], **pins}
        return write_loopback_inventory(self.root / "inventory", self.sshd, self.prefix, overrides=overrides,
                                        role_vars=role_vars)

    def key(self, arch: str = PINS["dsv4_flash_attn_arch_list"], torch: str = PINS["dsv4_torch_version"]) -> str:
        sm = arch.replace(".", "").replace(";", "_")
        return f"flash_attn-{VERSION}-torch{torch}-cu{PINS['dsv4_cuda_version']}-sm{sm}"

    def venv_build_dir(self) -> Path:
        (built,) = self.prefix.joinpath("opt/dsv4").glob("venv-*")
        return built

    def installed(self) -> tuple[str, str]:
        """(flash_attn.__version__, the archs its extension was built for) in the venv."""
        out = subprocess.run([str(self.venv_build_dir() / "bin/python"), "-c",
                              "import flash_attn, flash_attn_2_cuda; print(flash_attn.__version__, flash_attn_2_cuda.archs)"],
                             capture_output=True, text=True, check=True).stdout.split()
        return out[0], out[1]

    def marker(self) -> str:
        return (self.venv_build_dir() / ".dsv4kit-flash-attn.installed").read_text().strip()


@pytest.fixture
def box(tmp_path, loopback_ssh):
    if os.geteuid() != 0:
        pytest.skip("the loopback box is provisioned as root (file ownership)")
    return FlashAttnBox(tmp_path, loopback_ssh)


def provision(box: FlashAttnBox, *args: str, stages: str = "flash_attn") -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "-i", str(box.inventory),
                           "--tags", stages, *args], env=env, capture_output=True, text=True, timeout=600)


def build_task(result: subprocess.CompletedProcess) -> str:
    """What Ansible said about the build task: its status line (after any ASYNC POLL lines)."""
    after = result.stdout.split("TASK [flash_attn : Build the wheel", 1)[1]
    return next(line for line in after.splitlines()[1:] if line.startswith(("ok:", "changed:", "skipping:", "fatal:")))


def test_builds_from_source_then_reuses_the_cache_and_rebuilds_for_a_new_arch_list(box):
    first = provision(box, stages="sglang_venv,flash_attn")
    assert first.returncode == 0, first.stdout[-8000:]
    key = box.key()
    wheels = sorted((box.state / "wheels" / key).glob("flash_attn-*.whl"))
    # Built here from the sdist (a platform wheel), not the prebuilt wheel for other archs beside it.
    assert [w.name for w in wheels] == [f"flash_attn-{VERSION}-cp311-cp311-linux_x86_64.whl"]
    assert box.installed() == (VERSION, "120")
    assert box.marker() == key
    log = (box.state / "logs" / f"{key}.log").read_text()
    assert "-gencode arch=compute_120,code=sm_120 --threads 4" in log
    summary = json.loads((box.state / "logs" / f"{key}.json").read_text())
    assert summary["rc"] == 0 and summary["key"] == key and summary["nvcc_threads"] == 4 and summary["max_jobs"] >= 1
    assert not (box.state / "build/flash-attn").exists()  # the scratch space went with the build

    # Again: the cached wheel is the build; nothing runs, nothing changes.
    built_at = wheels[0].stat().st_mtime_ns, (box.state / "logs" / f"{key}.log").stat().st_mtime_ns
    second = provision(box)
    assert second.returncode == 0, second.stdout[-6000:]
    assert "provision: ok, 0 changed" in second.stdout, second.stdout[-6000:]
    assert build_task(second).startswith("skipping:")
    assert (wheels[0].stat().st_mtime_ns, (box.state / "logs" / f"{key}.log").stat().st_mtime_ns) == built_at

    # A new arch list is a new key: --check says a build would run and changes nothing ...
    box.write(dsv4_flash_attn_arch_list="12.0;10.0")
    new_key = box.key("12.0;10.0")
    check = provision(box, "--check")
    assert check.returncode == 0, check.stdout[-6000:]
    assert f"No cached wheel for {new_key}: a real run builds it" in check.stdout
    assert not (box.state / "wheels" / new_key).exists() and box.marker() == key

    # ... and the real run builds it (not pip's cached build for the old archs) and installs it.
    rebuilt = provision(box)
    assert rebuilt.returncode == 0, rebuilt.stdout[-8000:]
    assert build_task(rebuilt).startswith("changed:")
    assert len(list((box.state / "wheels" / new_key).glob("flash_attn-*.whl"))) == 1
    assert box.installed() == (VERSION, "120;100") and box.marker() == new_key

    # Back to the first arch list: its cached wheel is installed again without a build.
    box.write()
    back = provision(box)
    assert back.returncode == 0, back.stdout[-6000:]
    assert build_task(back).startswith("skipping:")
    assert box.installed() == (VERSION, "120") and box.marker() == key

    # A new torch pin is a new key too: built again.
    box.write(dsv4_torch_version="2.14.2")
    torch_key = box.key(torch="2.14.2")
    other_torch = provision(box)
    assert other_torch.returncode == 0, other_torch.stdout[-6000:]
    assert build_task(other_torch).startswith("changed:") and box.marker() == torch_key
    assert len(list((box.state / "wheels" / torch_key).glob("flash_attn-*.whl"))) == 1


def test_a_failed_build_stops_the_stage_with_its_log_and_cause(box):
    write_nvcc(box.cuda_home, PINS["dsv4_cuda_version"], cicc_crashes=True)
    failed = provision(box, stages="sglang_venv,flash_attn")
    assert failed.returncode == 6, failed.stdout[-8000:]
    key = box.key()
    log = box.state / "logs" / f"{key}.log"
    fatal = next(line for line in failed.stdout.splitlines() if line.startswith("fatal:"))
    assert f"The flash-attn {VERSION} build for {key} failed (exit status 1)" in fatal, fatal
    assert "Cause: nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)." in fatal, fatal
    assert f"Log: {log} (summary beside it)" in fatal, fatal
    assert "TASK [flash_attn : Install the cached wheel" not in failed.stdout
    assert "died due to signal 11" in log.read_text()
    assert json.loads(log.with_suffix(".json").read_text())["rc"] == 1
    assert not list((box.state / "wheels" / key).glob("*")), "a failed build caches no wheel"
    assert not (box.venv_build_dir() / ".dsv4kit-flash-attn.installed").exists()

    # nvcc fixed: the next run builds (the empty cache directory is no cached build).
    write_nvcc(box.cuda_home, PINS["dsv4_cuda_version"])
    fixed = provision(box)
    assert fixed.returncode == 0, fixed.stdout[-8000:]
    assert box.installed() == (VERSION, "120") and box.marker() == key
