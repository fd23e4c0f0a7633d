#!/usr/bin/env python3
"""Read-only look at what the driver stage starts from; prints one JSON object.

Usage: driver_box_state.py ROOT SYS_MODULE_DIR KERNEL OUR_BLACKLIST

  kernel_meta        the installed linux-image metapackage that tracks the running kernel's flavour
                     ("linux-image-generic-hwe-24.04"), found as ubuntu-drivers does: the meta whose
                     Depends names linux-image-KERNEL, else one of the same flavour; "" when none
  installed_kernels  versions of the installed linux-image-<version> packages, oldest first
  newest_kernel      the last of those (KERNEL when none is installed through dpkg)
  run_installer      a driver installed from NVIDIA's .run file (nvidia-uninstall present, or an
                     nvidia-smi that no package owns)
  nouveau_loaded     /sys/module/nouveau exists
  nouveau_blacklists modprobe.d files other than OUR_BLACKLIST that blacklist nouveau
Standard library only (the box's system Python).
"""
import glob
import json
import os
import re
import sys

# A kernel package is named by its version (linux-image-6.8.0-106-generic); a metapackage never
# starts with a digit there (linux-image-generic, linux-image-generic-hwe-24.04).
VERSIONED = re.compile(r"^linux-image-(?:unsigned-)?(\d.*)$")


def dpkg_status(root):
    """{package: (status, depends)} of the dpkg database under ROOT."""
    packages, fields = {}, {}
    path = os.path.join(root, "var/lib/dpkg/status")
    text = open(path).read() if os.path.exists(path) else ""
    for stanza in text.split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if "Package" in fields:
            packages[fields["Package"]] = (fields.get("Status", ""), fields.get("Depends", ""))
    return {name: dep for name, (status, dep) in packages.items() if status.endswith(" installed")}


def version_key(version):
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"[.-]", version)]


def flavour(kernel):
    return re.sub(r"^[0-9.]+-[0-9]+-", "", kernel)


def kernel_meta(installed, kernel):
    metas = {name: dep for name, dep in installed.items()
             if name.startswith("linux-image-") and not VERSIONED.match(name)}
    for name, dep in sorted(metas.items()):
        if re.search(r"(^|[ ,|])linux-image-(unsigned-)?%s([ ,(|]|$)" % re.escape(kernel), dep):
            return name
    same = [name for name, dep in sorted(metas.items()) if flavour(kernel) and flavour(kernel) in name]
    return same[0] if same else ""


def blacklists(root, ours):
    found = []
    for directory in ("etc/modprobe.d", "usr/lib/modprobe.d", "lib/modprobe.d"):
        for path in sorted(glob.glob(os.path.join(root, directory, "*.conf"))):
            if os.path.realpath(path) == os.path.realpath(ours) or path in found:
                continue
            with open(path, errors="replace") as fh:
                if any(re.match(r"\s*blacklist\s+nouveau\s*$", line) for line in fh):
                    found.append(path)
    return found


def owned_by_a_package(root, path):
    for listing in glob.glob(os.path.join(root, "var/lib/dpkg/info/*.list")):
        with open(listing, errors="replace") as fh:
            if any(line.strip() == path for line in fh):
                return True
    return False


def main(root, sys_module_dir, kernel, our_blacklist):
    installed = dpkg_status(root)
    kernels = sorted({VERSIONED.match(n).group(1) for n in installed if VERSIONED.match(n)}, key=version_key)
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    run_installer = os.path.exists(os.path.join(root, "usr/bin/nvidia-uninstall")) or (
        os.path.exists(smi) and not owned_by_a_package(root, "/usr/bin/nvidia-smi"))
    print(json.dumps({
        "kernel_meta": kernel_meta(installed, kernel),
        "installed_kernels": kernels,
        "newest_kernel": kernels[-1] if kernels else kernel,
        "run_installer": run_installer,
        "nouveau_loaded": os.path.isdir(os.path.join(sys_module_dir, "nouveau")),
        "nouveau_blacklists": blacklists(root, our_blacklist),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
