"""The driver and CUDA stages run for real, against a GPU box's package manager stood in for.

tests/fake_gpu_box.py gives real apt and dpkg in a scratch root (signed repositories of tiny .deb
packages: NVIDIA's CUDA repository with cuda-keyring, and an "Ubuntu" archive with the kernel
headers and the same driver names at a higher version) and nvidia-smi/modprobe/mokutil stand-ins.
Each test starts from a state real boxes come in: an older dsv4kit deb822 source that conflicts with
cuda-keyring's, Secure Boot on, no headers for the running kernel, a driver upgrade waiting for
unattended-upgrades. Only the nvidia_driver and cuda_toolkit stages run (over the loopback sshd).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_gpu_box import (BRANCH, CUDA_VERSION, FLAVOUR_META, KERNEL, NEWER_CUDA_VERSION, NEWER_KERNEL, SERVER_VERSION,
                                UBUNTU_VERSION, UNBRANCHED, UNBRANCHED_VERSION, Deb, FakeGPUBox, driver_debs, nvswitch_debs)
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
    box = FakeGPUBox(tmp_path / "fake", prefix, kernel=KERNEL)
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
    # The box runs an Ubuntu kernel (KERNEL): the playbook gets its name, as the facts of such a box give it.
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "-i", str(box.inventory), *stages,
                           "-e", f"ansible_kernel={box.kernel}", *args], env=env, capture_output=True, text=True, timeout=900)


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

    # The MOK flag set, the key created and queued (mokutil --import) but never confirmed at boot.
    cert = box.root / "var/lib/shim-signed/mok/MOK.der"
    cert.parent.mkdir(parents=True)
    cert.write_bytes(b"0\x82")
    box.role_vars["nvidia_driver_secure_boot_mok_enrolled"] = True
    reinventory(box)
    mok = provision(box)
    assert mok.returncode == 6, mok.stdout[-6000:]
    assert "nvidia_driver_secure_boot_mok_enrolled is true, but `mokutil --test-key" in mok.stdout
    assert f"{cert} is not enrolled" in mok.stdout
    assert not any(name.startswith(("nvidia-", "linux-headers", "cuda-keyring")) for name in installed(box))


def unattended_upgrades_would_install(box: FakeGPUBox) -> set[str]:
    """What unattended-upgrades would install, by its rule for Package-Blacklist, through apt itself
    (unattended-upgrades is not installed here): each installed package with an upgrade is marked
    alone (apt-get -s install), and kept back when it or anything apt would change with it matches
    a blacklist entry (re.match, as unattended-upgrades applies it)."""
    import re

    dump = box.run("apt-config", "dump", "Unattended-Upgrade::Package-Blacklist").stdout
    blacklist = [re.compile(m) for m in re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump, re.M)]
    # the installed packages with an upgrade ("Inst name [installed version] (candidate ...)")
    upgradable = [line.split()[1] for line in box.run("apt-get", "-s", "dist-upgrade").stdout.splitlines()
                  if line.startswith("Inst ") and line.split()[2].startswith("[")]
    taken: set[str] = set()
    for name in upgradable:
        plan = box.run("apt-get", "-s", "install", name, check=False)
        changed = {line.split()[1] for line in plan.stdout.splitlines() if line.startswith(("Inst ", "Remv "))}
        if plan.returncode == 0 and not any(rule.match(n) for rule in blacklist for n in changed | {name}):
            taken |= changed
    return taken


def test_secure_boot_uses_the_flavour_metapackage_and_follows_a_kernel_update(gpu_box):
    """ubuntu-drivers' route: linux-modules-nvidia-580-open-<flavour of the running kernel's metapackage>;
    a kernel update later brings its own signed module with a plain dist-upgrade."""
    box = gpu_box
    box.secure_boot(True)
    box.publish_ubuntu(signed_modules=True)
    # A point release pinned that Canonical has no signed modules of: the stop names the pin, not Secure Boot.
    reinventory(box, dsv4_driver_version=CUDA_VERSION.split("-")[0])
    pinned = provision(box)
    assert pinned.returncode == 6, pinned.stdout[-6000:]
    said = " ".join(pinned.stdout.split())
    assert f"dsv4_driver_version={CUDA_VERSION.split('-')[0]} is the cause" in said, pinned.stdout[-6000:]
    assert "Enroll MOK" not in said and not (box.root / "etc/apt/preferences.d/dsv4-nvidia-driver").exists()
    reinventory(box)
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

    # Ubuntu publishes a kernel update whose signed module was built against a newer driver point
    # release (580.142, the 580-noble release after 580.126.09), which the driver's blacklist keeps
    # from unattended-upgrades: it must not take the kernel alone.
    newest_driver = "580.142-0ubuntu0.24.04.1"
    box.publish_ubuntu(signed_modules=True, newest=NEWER_KERNEL, newest_driver=newest_driver)
    box.run("apt-get", "update")
    taken = unattended_upgrades_would_install(box)
    assert f"linux-image-{NEWER_KERNEL}" not in taken or f"linux-modules-nvidia-{BRANCH}-open-{NEWER_KERNEL}" in taken, taken
    # The new kernel's module needs nvidia-kernel-common-580 of the upstream version it was built
    # against (>= 580.142, <= 580.142-1): the installed 580.126.09 does not do, so apt takes the kernel
    # only with its module and the driver of that upstream version (its firmware package too).
    module = box.run("apt-cache", "show", f"linux-modules-nvidia-{BRANCH}-open-{NEWER_KERNEL}").stdout
    assert f"nvidia-kernel-common-{BRANCH} (>= 580.142), nvidia-kernel-common-{BRANCH} (<= 580.142-1)" in module, module
    plan = box.run("apt-get", "-s", "dist-upgrade").stdout
    inst = {line.split()[1]: line for line in plan.splitlines() if line.startswith("Inst ")}
    assert f"linux-image-{NEWER_KERNEL}" in inst, plan
    assert f"linux-modules-nvidia-{BRANCH}-open-{NEWER_KERNEL}" in inst, plan
    for name in (f"nvidia-kernel-common-{BRANCH}", f"nvidia-utils-{BRANCH}", f"nvidia-headless-no-dkms-{BRANCH}-open",
                 f"nvidia-firmware-{BRANCH}-580.142"):
        assert f"({newest_driver} " in inst.get(name, ""), (name, plan)

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
    box.install_now([Deb(f"linux-image-{NEWER_KERNEL}", "1.0-1")])  # a kernel update waiting for a reboot
    result = provision(box)
    assert result.returncode == 6
    assert f"apt has no linux-headers-{KERNEL}" in result.stdout
    assert f"A newer kernel, {NEWER_KERNEL}, is already installed and waits for a reboot" in " ".join(result.stdout.split())
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
    # The initramfs rebuild after the nouveau blacklist fails (a full /boot): the run stops, saying so,
    # and the rebuild stays pending although the blacklist is now in place.
    (box.state / "initramfs-fail").touch()
    failed = provision(box, stages=stages)
    assert failed.returncode == 6, failed.stdout[-8000:]
    assert "`update-initramfs -u -k all` failed (rc 1)" in failed.stdout and "No space left on device" in failed.stdout
    pending = box.root / "var/lib/dsv4kit/initramfs-rebuild-pending"
    assert pending.is_file() and "the next `dsv4kit provision` runs it again" in failed.stdout
    (box.state / "initramfs-fail").unlink()
    first = provision(box, stages=stages)
    assert first.returncode == 0, first.stdout[-8000:]
    assert not (box.sys_module / "nouveau").exists()
    assert (box.root / "etc/modprobe.d/dsv4-blacklist-nouveau.conf").is_file()
    # retried by the next run (the blacklist unchanged there), then no longer pending
    assert (box.state / "initramfs.log").read_text().splitlines() == ["update-initramfs -u -k all"] * 2
    assert not pending.exists()
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


def test_a_full_boot_is_refused_before_any_change_with_what_to_remove(gpu_box):
    """/boot a small filesystem of its own, 90% full: the run stops before apt, naming the free and the
    needed space and the kernel that is not running."""
    box = gpu_box
    boot = box.root / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(boot)], capture_output=True).returncode:
        pytest.skip("cannot mount a small /boot here")
    try:
        (boot / f"initrd.img-{KERNEL}").write_bytes(b"\0" * (24 << 20))
        (boot / "initrd.img-6.8.0-31-generic").write_bytes(b"\0" * (20 << 20))
        result = provision(box)
    finally:
        subprocess.run(["umount", str(boot)], check=True)
    assert result.returncode == 6, result.stdout[-6000:]
    assert f"{boot} has 4 MB free; rebuilding the initramfs" in result.stdout, result.stdout[-4000:]
    assert "needs about 56 MB" in result.stdout and "sudo apt autoremove --purge" in result.stdout
    assert "installed besides the running one: 6.8.0-31-generic (20 MB)" in result.stdout
    assert not any(name.startswith(("nvidia-", "linux-headers")) for name in installed(box))


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


def test_release_upgraded_box_ends_with_one_cuda_source_and_a_changed_point_release_is_applied(gpu_box):
    """22.04 -> 24.04: cuda-keyring 1.1-1 of ubuntu2204 stays installed with its source; the new
    distribution's cuda-keyring has the same version. Then dsv4_driver_version pins an older point
    release than the installed one: every driver package of the branch moves down to it, held there.
    The packages' real shape makes that explicit work: nvidia-headless-580-open needs the no-DKMS set
    and nvidia-dkms unversioned, so apt would keep them at the newer release; only the names given
    with the pinned version move them (and the firmware package, whose name carries the upstream
    version, is replaced by the pinned release's, not named with a version it never had)."""
    box = gpu_box
    old_repo = box.work / "compute/cuda/repos/ubuntu2204/x86_64"
    box.publish(old_repo, [], origin="NVIDIA", label="NVIDIA CUDA")
    box.keyring.parent.mkdir(parents=True, exist_ok=True)
    box.install_now([box.cuda_keyring("ubuntu2204", old_repo)])
    box.publish_cuda(newer=True)  # a newer point release of the branch is there from the start
    result = provision(box)  # no point release pinned: the newest of the branch
    assert result.returncode == 0, result.stdout[-8000:]
    sources = sorted(p.name for p in (box.root / "etc/apt/sources.list.d").iterdir())
    assert sources == ["cuda-debian12-x86_64.list", "ubuntu.sources"], sources
    assert installed(box)[f"nvidia-utils-{BRANCH}"] == (NEWER_CUDA_VERSION, "hold")
    assert "Check there is exactly one CUDA source" in result.stdout

    reinventory(box, dsv4_driver_version=CUDA_VERSION.split("-")[0])
    # --check first, as the docs tell: apt's own simulation under the pin not written yet, exit 0.
    pin_file = box.root / "etc/apt/preferences.d/dsv4-nvidia-driver"
    pin_before = pin_file.read_text()
    check = provision(box, "--check")
    assert check.returncode == 0, check.stdout[-8000:]
    assert "--check: the pin changes" in check.stdout, check.stdout[-6000:]
    assert f"Inst nvidia-utils-{BRANCH} [{NEWER_CUDA_VERSION}] ({CUDA_VERSION}" in check.stdout, check.stdout[-6000:]
    assert pin_file.read_text() == pin_before and installed(box)[f"nvidia-utils-{BRANCH}"][0] == NEWER_CUDA_VERSION
    pinned = provision(box)
    # The module loaded is the newer one: the downgrade needs a reboot, which the test box skips.
    assert pinned.returncode == 6 and "A reboot is pending (the driver install changed under a loaded module" in pinned.stdout, \
        pinned.stdout[-8000:]
    packages = installed(box)
    driver = {name for name in packages if name.startswith(("nvidia-", "libnvidia-"))}
    pinned_set = {deb.name for deb in driver_debs(CUDA_VERSION)}
    old_firmware = f"nvidia-firmware-{BRANCH}-{NEWER_CUDA_VERSION.split('-')[0]}"
    assert driver == pinned_set | {old_firmware}, driver ^ (pinned_set | {old_firmware})
    for name in pinned_set:
        assert packages[name] == (CUDA_VERSION, "hold"), (name, packages[name])
    # the newer release's firmware stays behind, not held and installed as a dependency (apt autoremove takes it)
    assert packages[old_firmware] == (NEWER_CUDA_VERSION, "install")
    assert old_firmware in box.run("apt-mark", "showauto").stdout.split()


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
    (box.root / "usr/bin/nvidia-uninstall").unlink()


def test_refusals_of_what_the_box_already_has(gpu_box):
    """A dpkg half-configured (--check says so), Ubuntu's -server branch with a fabric manager and
    NSCQ of another branch (reported), and dpkg's lock held by another process (named)."""
    box = gpu_box
    box.install_now([Deb("broken-tool", "1.0-1", postinst="#!/bin/sh\nexit 1\n")], check=False)
    check = provision(box, "--check")
    assert check.returncode == 6, check.stdout[-4000:]
    assert "dpkg left broken-tool half-configured unfinished" in check.stdout and "--check cannot predict" in check.stdout
    box.run("dpkg", "--root", str(box.root), "--admindir", str(box.root / "var/lib/dpkg"), "--force-script-chrootless",
            "--purge", "broken-tool")
    # A power cut mid-install: dpkg's journal is left unapplied (no package shows a broken state), which
    # apt itself refuses; the run says so before it writes the pin.
    journal = box.root / "var/lib/dpkg/updates/0001"
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text("Package: broken-tool\nStatus: purge ok not-installed\n\n")
    # apt itself refuses it when it takes dpkg's lock (a simulation takes none)
    assert "dpkg was interrupted" in box.run("apt-get", "install", "-y", "cuda-keyring", check=False).stderr
    interrupted = provision(box)
    assert interrupted.returncode == 6, interrupted.stdout[-4000:]
    assert "dpkg was interrupted (a power cut or a killed dpkg)" in " ".join(interrupted.stdout.split())
    assert "`sudo dpkg --configure -a`" in interrupted.stdout
    assert not (box.root / "etc/apt/preferences.d/dsv4-nvidia-driver").exists()
    journal.unlink()

    # Ubuntu's -server build of the branch as DeepOps installs it (the same names with -server, each
    # providing and conflicting with the same virtual name, in the packaging's real shape): apt would
    # remove every one of them but the firmware of another upstream version, which nothing conflicts with.
    server = [deb for deb in driver_debs(SERVER_VERSION, "-server")]
    box.install_now(server + nvswitch_debs("570", "570.172.08-0ubuntu1"))
    box.run("apt-get", "update")
    removals = box.run("apt-get", "-s", "install", f"nvidia-headless-no-dkms-{BRANCH}-open").stdout
    removed = {line.split()[1] for line in removals.splitlines() if line.startswith("Remv ")}
    server_firmware = f"nvidia-firmware-{BRANCH}-server-{SERVER_VERSION.split('-')[0]}"
    assert removed == {deb.name for deb in server} - {server_firmware}, removals
    refused = provision(box)
    assert refused.returncode == 6, refused.stdout[-4000:]
    assert "The -server driver branch is installed" in refused.stdout
    # apt picked the newest release here (another upstream), so the firmware stayed: the rule the message states
    assert f"apt would remove {len(removed)} of them, and {server_firmware} only when the driver it installs is of the " \
        "same upstream version. Nothing was changed." in " ".join(refused.stdout.split()), refused.stdout[-4000:]
    assert all(deb.name in refused.stdout for deb in server)  # all named, the firmware too (its purge is in the advice)
    # apt's own count for the packages the stage installs (a fabric manager or signed modules count too)
    route = box.run("apt-get", "-s", "install", f"nvidia-headless-{BRANCH}-open", f"nvidia-utils-{BRANCH}").stdout
    apt_removes = [line.split()[1] for line in route.splitlines() if line.startswith("Remv ")]
    assert f"the install removes {len(apt_removes)} packages: {', '.join(apt_removes)}." in " ".join(refused.stdout.split()), \
        refused.stdout[-4000:]
    assert "WARNING: libnvidia-nscq-570 570.172.08-0ubuntu1, nvidia-fabricmanager-570 570.172.08-0ubuntu1 are of another branch" \
        in " ".join(refused.stdout.split())
    assert all(installed(box)[deb.name][0] == SERVER_VERSION for deb in server)  # nothing changed
    box.run("dpkg", "--root", str(box.root), "--admindir", str(box.root / "var/lib/dpkg"), "--force-script-chrootless",
            "--force-depends", "--purge", *(deb.name for deb in server))

    # unattended-upgrades holds dpkg's lock: cuda-keyring's dpkg waits (bounded), then names it.
    lock = box.root / "var/lib/dpkg/lock-frontend"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
                               " fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(600)",
                               str(lock), "/usr/bin/unattended-upgrade"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        reinventory(box, dsv4_dpkg_lock_timeout=3)
        waited = provision(box)
    finally:
        holder.kill()
        holder.wait()
    assert waited.returncode == 6, waited.stdout[-4000:]
    assert f"dpkg's lock {lock} is still held after 3 s" in waited.stdout
    assert f"by process {holder.pid} (" in waited.stdout and "/usr/bin/unattended-upgrade" in waited.stdout
    assert "cuda-keyring" not in installed(box)


@pytest.mark.parametrize("secure_boot", [True, False])
def test_diagnosis_names_nouveau_holding_the_gpus(tmp_path, secure_boot):
    """Canonical's signed module present, NVRM saying another driver owns the devices: the cause is
    nouveau, with Secure Boot on or off (never "Secure Boot rejects" nor "unknown")."""
    box = FakeGPUBox(tmp_path / "fake", tmp_path / "root", kernel=KERNEL)
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


def test_an_hwe_box_with_a_kernel_update_pending_keeps_its_hwe_flavour(tmp_path):
    """The HWE metapackage names the pending kernel, not the running one: the flavour is still
    HWE's (generic-hwe-24.04), never the GA metapackage's that also names a "generic" kernel."""
    if os.geteuid() != 0:
        pytest.skip("dpkg installs into the scratch root as root")
    running, pending, ga = "6.11.0-28-generic", "6.11.0-29-generic", "6.8.0-90-generic"
    box = FakeGPUBox(tmp_path / "fake", tmp_path / "root", kernel=running)
    try:
        box.install_now([Deb(f"linux-image-{k}", "1.0-1") for k in (running, pending, ga)]
                        + [Deb("linux-image-generic-hwe-24.04", pending, depends=f"linux-image-{pending}"),
                           Deb("linux-image-generic", ga, depends=f"linux-image-{ga}")])
        script = REPO / "playbooks/roles/nvidia_driver/files/driver_box_state.py"
        out = subprocess.run([sys.executable, str(script), f"{box.root}/", str(box.sys_module), running,
                              str(box.root / "etc/modprobe.d/x.conf")], capture_output=True, text=True, check=True).stdout
        state = json.loads(out)
        assert state["kernel_meta"] == "linux-image-generic-hwe-24.04", state
        assert state["newest_kernel"] == pending
    finally:
        box.close()


def test_the_dpkg_lock_wait_runs_the_command_once_the_holder_lets_go(tmp_path):
    """dpkg_lock_wait.py: a lock released within the limit is waited for, then the command runs."""
    lock = tmp_path / "var/lib/dpkg/lock-frontend"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
                               " fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(2)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    script = REPO / "playbooks/roles/nvidia_driver/files/dpkg_lock_wait.py"
    done = subprocess.run([sys.executable, str(script), f"{tmp_path}/", "60", "--", "sh", "-c", "echo installed"],
                          capture_output=True, text=True, timeout=90)
    holder.wait()
    assert done.returncode == 0 and done.stdout == "installed\n", done.stderr
