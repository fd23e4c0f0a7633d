#!/usr/bin/env python3
"""Is there room in /boot to rebuild an initramfs? Read-only; standard library only.

Usage: boot_space.py BOOT_DIR RUNNING_KERNEL MARGIN_MB

``update-initramfs -u -k all`` writes each kernel's new initrd beside the old one before it
replaces it, so /boot needs the largest initrd's size free, plus a margin for the driver's
additions. Prints one JSON object: ``free_mb``, ``need_mb``, ``enough``, ``initrds`` (name, MB,
kernel, running), and ``message`` (what to remove) when there is not enough. A missing BOOT_DIR
is ``{"exists": false, "enough": true}``.
"""
import json
import os
import sys

MB = 1024 * 1024


def main(argv):
    boot, running, margin = argv[0], argv[1], float(argv[2])
    if not os.path.isdir(boot):
        return {"exists": False, "enough": True}
    stats = os.statvfs(boot)
    free = stats.f_bavail * stats.f_frsize / MB
    initrds = []
    for name in sorted(os.listdir(boot)):
        path = os.path.join(boot, name)
        if name.startswith("initrd.img-") and os.path.isfile(path) and not os.path.islink(path):
            kernel = name[len("initrd.img-"):]
            initrds.append({"name": name, "mb": round(os.path.getsize(path) / MB, 1), "kernel": kernel,
                            "running": kernel == running})
    largest = max((item["mb"] for item in initrds), default=0.0)
    need = round(largest + margin, 1)
    out = {"exists": True, "boot": boot, "free_mb": round(free, 1), "need_mb": need, "enough": free >= need,
           "initrds": initrds}
    if not out["enough"]:
        others = [f"{item['kernel']} ({item['mb']:g} MB)" for item in initrds if not item["running"]]
        out["message"] = (
            f"{boot} has {free:.0f} MB free; rebuilding the initramfs (which keeps nouveau off the GPUs at the next "
            f"boot) needs about {need:.0f} MB: the largest initrd ({largest:g} MB) is written beside the old one, "
            f"plus nvidia_driver_boot_margin_mb={margin:g}. Nothing was changed. Free space in {boot}: remove kernels "
            f"you no longer boot with `sudo apt autoremove --purge`, or purge them by name (`dpkg -l 'linux-image-*' "
            f"| grep ^ii` lists them; never the running {running})"
            + (f"; installed besides the running one: {', '.join(others)}" if others else
               "; only the running kernel's initrd is there: make /boot larger or remove other files from it")
            + ". Then run `dsv4kit provision` again.")
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
