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

from tests.fake_gpu_box import (BRANCH, CUDA_VERSION, FLAVOUR_META, KERNEL, NEWER_CUDA_VERSION, NEWER_KERNEL, UBUNTU_VERSION,
                                UNBRANCHED, UNBRANCHED_VERSION, Deb, FakeGPUBox)
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
    box.boot_kernel()  # the running kernel and its linux-image metapackage, as on any Ubuntu box
    box.role_vars = {
        "nvidia_driver_repo_url": f"file://{box.cuda_repo}/",
        "nvidia_driver_proc_version": str(box.proc_version),
        "nvidia_driver_reboot_required_pkgs": str(box.state / "reboot-required.pkgs"),
        "nvidia_driver_sys_module_dir": str(box.sys_module),
        "host_tuning_sys_module_dir": str(box.sys_module),
        # nvidia-persistenced through the systemctl stand-in (Ubuntu's Type=forking unit).
        "nvidia_driver_manage_units": True,
        "provision_task_environment": box.environment(),
    }
    box.inventory_dir, box.ssh = tmp_path / "inventory", loopback_ssh
    reinventory(box)
    yield box
    box.close()


def reinventory(box: FakeGPUBox, **overrides) -> None:
    # Never a real reboot of this machine: a pending one stops the run.
    box.inventory = write_loopback_inventory(box.inventory_dir, box.ssh, box.root,
                                             overrides={"dsv4_gpu_present": True, "dsv4_driver_skip_reboot": True,
                                                        **overrides}, role_vars=box.role_vars)


def provision(box: FakeGPUBox, *args: str, stages: tuple[str, ...] = STAGES) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "-i", str(box.inventory), *stages, *args],
                          env=env, capture_output=True, text=True, timeout=900)


def changed_tasks(stdout: str) -> list[str]:
    """The TASK headers followed by a changed result (for a failed idempotence check)."""
    task, out = "", []
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed:"):
            out.append(f"{task} {line}")
    return out


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
    assert legacy.is_file() and not any(name.startswith(("nvidia-", "linux-headers")) for name in installed(box))

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
    assert '"^(nvidia-(driver|headless|dkms|kernel|utils' in blacklist  # the driver's own packages only

    second = provision(box)
    assert second.returncode == 0, second.stdout[-6000:]
    assert "provision: ok, 0 changed" in second.stdout, changed_tasks(second.stdout)


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
    assert result.returncode == 6, result.stdout[-6000:]
    assert "Secure Boot is on and apt cannot install Canonical's signed open modules" in result.stdout
    assert f"linux-modules-nvidia-580-open-{FLAVOUR_META}" in result.stdout
    for step in ("update-secureboot-policy --new-key", "update-secureboot-policy --enroll-key", "mokutil --import",
                 "Enroll MOK", "nvidia_driver_secure_boot_mok_enrolled: true"):
        assert step in result.stdout, step
    packages = installed(box)
    assert not any(name.startswith(("nvidia-", "linux-headers", "cuda-keyring")) for name in packages)
    # checked against the archive before anything was written: no keyring, no source, no pin
    assert not (box.root / "etc/apt/preferences.d/dsv4-nvidia-driver").exists()
    assert not (box.root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").exists()


def test_secure_boot_uses_the_flavour_metapackage_and_follows_a_kernel_update(gpu_box):
    """ubuntu-drivers' route: linux-modules-nvidia-580-open-<flavour of the running kernel's metapackage>;
    a kernel update later brings its own signed module with a plain dist-upgrade."""
    box = gpu_box
    box.secure_boot(True)
    box.publish_ubuntu(signed_modules=True)
    result = provision(box)
    assert result.returncode == 0, result.stdout[-8000:]
    packages = installed(box)
    assert f"linux-modules-nvidia-{BRANCH}-open-{FLAVOUR_META}" in packages
    assert f"linux-modules-nvidia-{BRANCH}-open-{KERNEL}" in packages
    assert f"nvidia-dkms-{BRANCH}-open" not in packages and f"linux-headers-{KERNEL}" not in packages
    assert packages[f"nvidia-utils-{BRANCH}"][0].endswith("ubuntu0.24.04.1")  # one origin: Ubuntu's
    assert packages[f"nvidia-utils-{BRANCH}"][1] == "install"  # not held: a kernel update must bring its module
    assert packages["cuda-keyring"][0] == "1.1-1"  # no CUDA source on this box: NVIDIA's keyring installed
    assert (box.root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").is_file()
    assert box.proc_version.is_file()
    # Ubuntu's nvidia-kernel-common blacklists nouveau: no second blacklist of dsv4kit's.
    assert not (box.root / "etc/modprobe.d/dsv4-blacklist-nouveau.conf").exists()

    # Ubuntu publishes a kernel update with its signed module; the box takes it with apt.
    box.publish_ubuntu(signed_modules=True, newest=NEWER_KERNEL)
    box.run("apt-get", "update")
    upgrade = box.run("apt-get", "-y", "dist-upgrade", check=False)
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    packages = installed(box)
    assert f"linux-image-{NEWER_KERNEL}" in packages
    assert f"linux-modules-nvidia-{BRANCH}-open-{NEWER_KERNEL}" in packages, upgrade.stdout
    again = provision(box)
    assert again.returncode == 0, again.stdout[-6000:]


def test_secure_boot_on_a_kernel_older_than_the_newest(gpu_box):
    """The running kernel's own signed package needs an nvidia-kernel-common that is no longer
    published ("held broken packages"); the flavour metapackage brings the newest kernel's module."""
    box = gpu_box
    box.secure_boot(True)
    box.install_now([Deb(f"linux-image-{NEWER_KERNEL}", "1.0-1")])  # installed by an update, not booted yet
    box.publish_ubuntu(signed_modules=True, newest=NEWER_KERNEL, old_kernels=(KERNEL,))
    result = provision(box)
    assert result.returncode == 6, result.stdout[-8000:]
    assert "held broken packages" not in result.stdout
    assert f"Canonical's signed module is for kernel {NEWER_KERNEL}" in result.stdout, result.stdout[-5000:]
    assert "A reboot is pending" in result.stdout
    assert f"linux-modules-nvidia-{BRANCH}-open-{NEWER_KERNEL}" in installed(box)
    assert not box.proc_version.exists()  # nothing loaded for the old kernel


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


def test_first_install_in_nvidias_order(gpu_box):
    """Bare box: nouveau bound to the GPUs, Ubuntu's Type=forking nvidia-persistenced, udev loading
    nvidia-uvm as soon as the driver binds, nvidia-container-toolkit installed. One run gets through,
    and a rerun changes nothing."""
    box = gpu_box
    box.load_nouveau()
    box.install_now([Deb("nvidia-container-toolkit", "1.17.8-1"), Deb("libnvidia-container1", "1.17.8-1")])
    box.publish_cuda(newer=False, container="1.18.0-1")  # a security fix is published
    stages = ("--tags", "nvidia_driver,cuda_toolkit,host_tuning")
    first = provision(box, stages=stages)
    assert first.returncode == 0, first.stdout[-8000:]
    assert not (box.sys_module / "nouveau").exists()
    assert (box.root / "etc/modprobe.d/dsv4-blacklist-nouveau.conf").is_file()
    assert "update-initramfs -u -k all" in (box.state / "initramfs.log").read_text()
    # enabled before the module, started only once it is loaded (a start before fails), then read back
    log = box.systemctl_log()
    assert any(line.startswith("enable") for line in log) and any(line.startswith("start") for line in log), log
    assert "Persistence mode is not on" not in first.stdout
    assert (box.state / "persistenced-running").exists()
    # uvm_disable_hmm live although udev loaded nvidia-uvm before host_tuning wrote the option
    assert (box.sys_module / "nvidia_uvm/parameters/uvm_disable_hmm").read_text().strip() == "Y"
    # the pin leaves nvidia-container-toolkit alone: its update is a candidate, nothing holds it
    box.run("apt-get", "update")
    policy = box.run("apt-cache", "policy", "nvidia-container-toolkit").stdout
    assert "Candidate: 1.18.0-1" in policy, policy
    assert installed(box)["nvidia-container-toolkit"] == ("1.17.8-1", "install")
    blacklist = box.run("apt-config", "dump", "Unattended-Upgrade::Package-Blacklist").stdout
    assert "container" not in blacklist and "nvidia-utils" not in blacklist
    assert box.run("sh", "-c", f"echo nvidia-container-toolkit | grep -Eq \"$(apt-config dump Unattended-Upgrade::Package-Blacklist"
                   " | sed -n 's/^Unattended-Upgrade::Package-Blacklist:: \"\\(.*\\)\";$/\\1/p')\"", check=False).returncode == 1
    second = provision(box, stages=stages)
    assert second.returncode == 0, second.stdout[-6000:]
    assert "provision: ok, 0 changed" in second.stdout, changed_tasks(second.stdout)


def test_a_box_running_another_driver_stops_for_the_reboot_before_persistenced(gpu_box):
    box = gpu_box
    box.load_driver("570.172.08")
    result = provision(box)
    assert result.returncode == 6, result.stdout[-8000:]
    assert "A reboot is pending (the driver install changed under a loaded module" in result.stdout
    assert "Driver/library version mismatch" in result.stdout
    log = box.systemctl_log()
    assert any(line.startswith("enable") for line in log)
    assert not any(line.startswith(("start", "restart")) for line in log), log  # not against the old module


def test_nouveau_in_use_is_a_reboot_not_a_failed_modprobe(gpu_box):
    box = gpu_box
    box.load_nouveau(in_use=True)
    result = provision(box)
    assert result.returncode == 6, result.stdout[-8000:]
    assert "nouveau is loaded and could not be unloaded" in result.stdout and "A reboot is pending" in result.stdout
    assert "`modprobe nvidia` failed" not in result.stdout


def test_release_upgraded_box_ends_with_one_cuda_source_and_a_point_release(gpu_box):
    """22.04 -> 24.04: cuda-keyring 1.1-1 of ubuntu2204 stays installed with its source; the new
    distribution's cuda-keyring has the same version. dsv4_driver_version pins a point release."""
    box = gpu_box
    old_repo = box.work / "compute/cuda/repos/ubuntu2204/x86_64"
    box.publish(old_repo, [], origin="NVIDIA", label="NVIDIA CUDA")
    box.keyring.parent.mkdir(parents=True, exist_ok=True)
    box.install_now([box.cuda_keyring("ubuntu2204", old_repo)])
    box.publish_cuda(newer=True)  # a newer point release of the branch is there from the start
    reinventory(box, dsv4_driver_version=CUDA_VERSION.split("-")[0])
    result = provision(box)
    assert result.returncode == 0, result.stdout[-8000:]
    sources = sorted(p.name for p in (box.root / "etc/apt/sources.list.d").iterdir())
    assert sources == ["cuda-debian12-x86_64.list", "ubuntu.sources"], sources
    assert installed(box)[f"nvidia-utils-{BRANCH}"] == (CUDA_VERSION, "hold")  # not NEWER_CUDA_VERSION
    assert "Check there is exactly one CUDA source" in result.stdout


def test_branch_595_in_nvidias_new_naming(gpu_box):
    box = gpu_box
    box.publish_cuda(newer=False, unbranched=True)
    box.publish_ubuntu(unbranched=True)
    reinventory(box, dsv4_driver_branch=UNBRANCHED)
    result = provision(box)
    assert result.returncode == 0, result.stdout[-8000:]
    packages = installed(box)
    for name in (f"nvidia-driver-pinning-{UNBRANCHED}", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-smi"):
        assert packages[name] == (UNBRANCHED_VERSION, "hold"), (name, packages.get(name))
    assert f"nvidia-utils-{UNBRANCHED}" not in packages  # Ubuntu's build of the branch: another origin
    policy = box.run("apt-cache", "policy", "nvidia-driver-cuda").stdout
    assert "600.10-1 -1" in " ".join(policy.split()), policy  # the next branch under the same name: never


def test_refusals_before_any_change(gpu_box):
    """A branch below what the CUDA pin needs, and a driver from NVIDIA's .run file."""
    box = gpu_box
    reinventory(box, dsv4_driver_branch="570")
    low = provision(box)
    assert low.returncode == 6 and "below 580, the oldest branch CUDA 13.0" in low.stdout, low.stdout[-4000:]
    reinventory(box)
    (box.root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (box.root / "usr/bin/nvidia-uninstall").write_text("#!/bin/sh\n")
    run = provision(box)
    assert run.returncode == 6 and "installed from NVIDIA's .run file" in run.stdout, run.stdout[-4000:]
    assert not (box.root / "etc/apt/preferences.d/dsv4-nvidia-driver").exists()
    assert not any(name.startswith(("nvidia-", "cuda-keyring")) for name in installed(box))


@pytest.mark.parametrize("secure_boot", [True, False])
def test_diagnosis_names_nouveau_holding_the_gpus(tmp_path, secure_boot):
    """Canonical's signed module present, NVRM saying another driver owns the devices: the cause is
    nouveau, with Secure Boot on or off (never "Secure Boot rejects" nor "unknown")."""
    box = FakeGPUBox(tmp_path / "fake", tmp_path / "root")
    try:
        box.secure_boot(secure_boot)
        ko = box.root / f"lib/modules/{KERNEL}/kernel/nvidia-{BRANCH}-open/nvidia.ko"
        ko.parent.mkdir(parents=True)
        ko.write_text("signed\n")
        (box.state / "dmesg").write_text(
            "NVRM: The NVIDIA probe routine was not called for 8 device(s).\n"
            "NVRM: This can occur when another driver was loaded and obtained ownership of the NVIDIA device(s).\n")
        script = REPO / "playbooks/roles/nvidia_driver/files/module_load_diagnosis.sh"
        out = box.run("sh", str(script), KERNEL, f"{box.root}/", str(box.root / "var/lib/dkms"), str(box.sys_module)).stdout
        assert out.splitlines()[0].startswith("Cause: nouveau holds the GPUs"), out
    finally:
        box.close()
