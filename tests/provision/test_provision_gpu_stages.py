"""The driver and CUDA stages run for real, against a GPU box's package manager stood in for.

tests/fake_gpu_box.py gives real apt and dpkg in a scratch root (signed repositories of tiny .deb
packages: NVIDIA's CUDA repository with cuda-keyring, and an "Ubuntu" archive with the kernel
headers and the same driver names at a higher version) and nvidia-smi/modprobe/mokutil stand-ins.
Each test starts from a state real boxes come in: an older dsv4kit deb822 source that conflicts with
cuda-keyring's, Secure Boot on, no headers for the running kernel, a driver upgrade waiting for
unattended-upgrades. Only the nvidia_driver and cuda_toolkit stages run (over the loopback sshd).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_gpu_box import BRANCH, CUDA_VERSION, KERNEL, NEWER_CUDA_VERSION, UBUNTU_VERSION, Deb, FakeGPUBox
from tests.provision_inventory import write_loopback_inventory

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STAGES = ("--tags", "nvidia_driver,cuda_toolkit")
LEGACY_SOURCE = """Types: deb
URIs: {url}
Suites: /
Signed-By: /etc/apt/keyrings/cuda.asc
"""


@pytest.fixture
def gpu_box(tmp_path, loopback_ssh):
    if os.geteuid() != 0:
        pytest.skip("dpkg installs into the scratch root as root")
    prefix = tmp_path / "prefix"
    box = FakeGPUBox(tmp_path / "fake", prefix)
    box.secure_boot(False)
    box.publish_cuda(newer=False)
    box.publish_ubuntu()
    role_vars = {
        "nvidia_driver_repo_url": f"file://{box.cuda_repo}/",
        "nvidia_driver_proc_version": str(box.proc_version),
        "nvidia_driver_reboot_required_pkgs": str(box.state / "reboot-required.pkgs"),
        "provision_task_environment": box.environment(),
    }
    box.inventory = write_loopback_inventory(tmp_path / "inventory", loopback_ssh, prefix,
                                             # Never a real reboot of this machine: a pending one stops the run.
                                             overrides={"dsv4_gpu_present": True, "dsv4_driver_skip_reboot": True},
                                             role_vars=role_vars)
    yield box
    box.close()


def provision(box: FakeGPUBox, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "-i", str(box.inventory), *STAGES, *args],
                          env=env, capture_output=True, text=True, timeout=900)


def installed(box: FakeGPUBox) -> dict[str, tuple[str, str]]:
    """package -> (version, selection) in the scratch root's dpkg database."""
    out = box.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Want} ${db:Status-Status}\n", check=False).stdout
    return {name: (version, want) for name, version, want, status in (line.split() for line in out.splitlines())
            if status == "installed"}


def test_driver_and_cuda_install_for_real_over_a_conflicting_legacy_source(gpu_box):
    box = gpu_box
    box.run("apt-get", "update")  # the box's lists of its distribution's archive, as on any box
    legacy = box.root / "etc/apt/sources.list.d/cuda.sources"
    legacy.write_text(LEGACY_SOURCE.format(url=f"file://{box.cuda_repo}/"))
    (box.root / "etc/apt/keyrings").mkdir(parents=True)
    (box.root / "etc/apt/keyrings/cuda.asc").write_bytes(box.key.read_bytes())
    # cuda-keyring installed by hand next to an older dsv4kit's source: apt refuses every command.
    keyring_list = box.root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list"
    keyring_list.write_text(f"deb [signed-by={box.keyring}] file://{box.cuda_repo}/ /\n")
    box.keyring.write_bytes(box.key.read_bytes())
    broken = box.run("apt-get", "update", check=False)
    assert "Conflicting values set for option Signed-By" in broken.stderr

    # --check reports the source it would remove and changes nothing.
    check = provision(box, "--check")
    assert check.returncode == 0, check.stdout[-6000:]
    assert f"Removing {legacy}" in check.stdout and "apt cannot read its sources now" in check.stdout
    assert legacy.is_file() and not installed(box)

    first = provision(box)
    assert first.returncode == 0, first.stdout[-8000:]
    assert not legacy.exists() and not (box.root / "etc/apt/keyrings/cuda.asc").exists()
    assert (box.state.parent.parent / "prefix/var/lib/dsv4kit/apt-sources-removed/cuda.sources").is_file()
    assert keyring_list.is_file(), "cuda-keyring's own source is the one source of the CUDA repository"
    packages = installed(box)
    assert "cuda-keyring" not in packages  # its source was there: reused, not installed a second time
    assert packages[f"linux-headers-{KERNEL}"][0] == "1.0-1"
    # The CUDA repository's driver, not Ubuntu's higher version of the same names, and no point release.
    for name in (f"nvidia-headless-{BRANCH}-open", f"nvidia-utils-{BRANCH}", f"nvidia-kernel-common-{BRANCH}"):
        assert packages[name] == (CUDA_VERSION, "hold"), (name, packages.get(name))
    assert "cuda-toolkit-13-0" in packages
    # DKMS built against the headers installed first; the module was loaded without a reboot.
    assert (box.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko").is_file()
    assert box.proc_version.is_file()
    assert "changed: [loop]" in first.stdout
    dropin = box.root / "etc/systemd/system/nvidia-persistenced.service.d/dsv4-persistence-mode.conf"
    exec_start = [l for l in dropin.read_text().splitlines() if l.startswith("ExecStart=")]
    assert exec_start[0] == "ExecStart=" and exec_start[1].endswith("--persistence-mode --verbose")

    # NVIDIA publishes a point release and another branch: the upgrade unattended-upgrades would make
    # is not taken (pinned, held and blacklisted).
    box.publish_cuda(newer=True)
    box.run("apt-get", "update")
    upgrade = box.run("apt-get", "-s", "dist-upgrade")
    assert "nvidia-utils" not in "\n".join(l for l in upgrade.stdout.splitlines() if l.startswith("Inst "))
    policy = box.run("apt-cache", "policy", f"nvidia-utils-{BRANCH}").stdout
    assert f"Installed: {CUDA_VERSION}" in policy and NEWER_CUDA_VERSION in policy
    ubuntu = next(line for line in policy.splitlines() if UBUNTU_VERSION in line)
    assert ubuntu.split()[-1] == "-1", policy  # the same names from another origin: never
    blacklist = box.run("apt-config", "dump", "Unattended-Upgrade::Package-Blacklist").stdout
    assert '"^(lib)?nvidia-"' in blacklist

    second = provision(box)
    assert second.returncode == 0, second.stdout[-6000:]
    assert "provision: ok, 0 changed" in second.stdout, second.stdout[-6000:]


def test_cuda_keyring_source_already_present_is_reused(gpu_box):
    box = gpu_box
    keyring_list = box.root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list"
    keyring_list.write_text(f"deb [signed-by={box.keyring}] file://{box.cuda_repo}/ /\n")
    box.keyring.write_bytes(box.key.read_bytes())
    result = provision(box)
    assert result.returncode == 0, result.stdout[-8000:]
    sources = sorted(p.name for p in (box.root / "etc/apt/sources.list.d").iterdir())
    assert sources == ["cuda-debian12-x86_64.list", "ubuntu.sources"]
    assert "cuda-keyring" not in installed(box)  # reused, never a second source


def test_secure_boot_without_signed_modules_stops_before_any_change(gpu_box):
    box = gpu_box
    box.secure_boot(True)
    result = provision(box)
    assert result.returncode == 6
    assert "Secure Boot is on and apt has no linux-modules-nvidia-580-open-" in result.stdout
    assert "mokutil --import" in result.stdout and "Enroll MOK" in result.stdout
    assert not any(name.startswith(("nvidia-", "linux-headers")) for name in installed(box))


def test_secure_boot_uses_canonicals_signed_modules(gpu_box):
    box = gpu_box
    box.secure_boot(True)
    box.publish_ubuntu(signed_modules=True)
    result = provision(box)
    assert result.returncode == 0, result.stdout[-8000:]
    packages = installed(box)
    assert f"linux-modules-nvidia-{BRANCH}-open-{KERNEL}" in packages
    assert f"nvidia-dkms-{BRANCH}-open" not in packages and f"linux-headers-{KERNEL}" not in packages
    assert packages[f"nvidia-utils-{BRANCH}"][0].endswith("ubuntu0.24.04.1")  # one origin: Ubuntu's
    assert packages["cuda-keyring"][0] == "1.1-1"  # no CUDA source on this box: NVIDIA's keyring installed
    assert (box.root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").is_file()
    assert box.proc_version.is_file()


def test_missing_headers_stop_before_the_driver(gpu_box):
    box = gpu_box
    box.publish_ubuntu(headers=False)
    result = provision(box)
    assert result.returncode == 6
    assert f"apt has no linux-headers-{KERNEL}" in result.stdout
    assert not any(name.startswith("nvidia-") for name in installed(box))


def test_a_module_that_does_not_load_names_its_cause(gpu_box):
    """Headers whose package is installed but broken (no build tree): DKMS builds nothing."""
    box = gpu_box
    box.publish_ubuntu(headers=False)
    box.publish(box.ubuntu_repo, [Deb(f"linux-headers-{KERNEL}", "1.0-1")], origin="Ubuntu")
    result = provision(box)
    assert result.returncode == 6
    assert "`modprobe nvidia` failed" in result.stdout
    assert f"Cause: no nvidia module was built for kernel {KERNEL}: its headers are missing" in result.stdout
