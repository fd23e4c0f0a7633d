#!/usr/bin/env python3
"""Read-only probe of the box for the preflight role: prints one JSON object.

Standard library only (runs on the box's system Python before anything is installed).
Usage: preflight_probe.py DISK_PATH
"""
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller


def read(path, default=None):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return default


def lspci(*args):
    exe = shutil.which("lspci") or ("/usr/bin/lspci" if os.path.exists("/usr/bin/lspci") else None)
    if exe is None:
        return None
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def secure_boot():
    """mokutil's answer ("SecureBoot enabled"/"disabled"), or None without mokutil or EFI."""
    exe = shutil.which("mokutil")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--sb-state"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout + out.stderr).strip()
    return text.splitlines()[0] if text else None


def gpus_from_sysfs():
    found = []
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        if read(dev + "/vendor") == NVIDIA_VENDOR and (read(dev + "/class") or "")[:6] in DISPLAY_CLASSES:
            found.append(os.path.basename(dev))
    return found


def main():
    disk_path = sys.argv[1] if len(sys.argv) > 1 else "/"
    while not os.path.exists(disk_path):
        disk_path = os.path.dirname(disk_path) or "/"
    cmdline = read("/proc/cmdline", "")
    meminfo = read("/proc/meminfo", "")
    mem_kb = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+):\s+(\d+) kB", meminfo, re.M)}
    listing = lspci("-D", "-d", "10de:", "-nn")
    lspci_gpus = None
    if listing is not None:
        lspci_gpus = [l.split()[0] for l in listing.splitlines()
                      if re.search(r"VGA compatible controller|3D controller", l)]
    acs = lspci("-vvv")
    acs_enabled = None
    if acs is not None and "ACSCtl" in acs:
        acs_enabled = sum(1 for l in acs.splitlines() if "ACSCtl:" in l and "SrcValid+" in l)
    disk = shutil.disk_usage(disk_path)
    print(json.dumps({
        "kernel": platform.release(),
        # "6.8.0-45-generic" -> "generic": Canonical's signed NVIDIA modules are built per flavour.
        "kernel_flavour": re.sub(r"^[0-9.]+-[0-9]+-", "", platform.release()),
        "secure_boot": secure_boot(),
        "cmdline": cmdline,
        "lspci_available": listing is not None,
        "gpu_count_lspci": None if lspci_gpus is None else len(lspci_gpus),
        "gpu_count_sysfs": len(gpus_from_sysfs()),
        "iommu_groups": len(glob.glob("/sys/kernel/iommu_groups/*")),
        "iommu_cmdline": [t for t in cmdline.split() if "iommu" in t],
        "acs_ports_with_srcvalid": acs_enabled,
        "pcie_aspm_policy": read("/sys/module/pcie_aspm/parameters/policy"),
        "pcie_aspm_off": "pcie_aspm=off" in cmdline.split(),
        "mem_total_gb": round(mem_kb.get("MemTotal", 0) / 2**20, 1),
        "mem_available_gb": round(mem_kb.get("MemAvailable", 0) / 2**20, 1),
        "disk_path": disk_path,
        "disk_free_gb": round(disk.free / 2**30, 1),
        "nvidia_driver_loaded": os.path.isdir("/sys/module/nvidia"),
        "nvidia_driver_version": read("/sys/module/nvidia/version"),
    }))


if __name__ == "__main__":
    main()
