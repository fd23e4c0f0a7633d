#!/usr/bin/env python3
"""Read-only look at what the driver stage starts from; prints one JSON object.

Usage: driver_box_state.py ROOT SYS_MODULE_DIR KERNEL OUR_BLACKLIST [DRIVER_PACKAGE_REGEX]

  kernel_meta        the installed linux-image metapackage that tracks the running kernel's flavour
                     ("linux-image-generic-hwe-24.04"), found as ubuntu-drivers does: the meta whose
                     Depends names linux-image-KERNEL, else one of the same flavour; "" when none
  installed_kernels  versions of the installed linux-image-<version> packages, oldest first
  newest_kernel      the last of those (KERNEL when none is installed through dpkg)
  run_installer      a driver installed from NVIDIA's .run file (nvidia-uninstall present, or an
                     nvidia-smi that no package owns)
  nouveau_loaded     /sys/module/nouveau exists
  nouveau_blacklists modprobe.d files other than OUR_BLACKLIST that blacklist nouveau
  driver_packages    [name, version] of the installed packages DRIVER_PACKAGE_REGEX matches
  broken_packages    [name, status] of the packages dpkg left half-installed, unpacked or
                     half-configured (an interrupted install: apt refuses to run until it is fixed)
  dpkg_journal       the entries of dpkg's journal (ROOT/var/lib/dpkg/updates/NNNN) a power cut or a
                     killed dpkg left: apt refuses every install ("dpkg was interrupted") until
                     `dpkg --configure -a` replays it
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


def dpkg_records(root):
    """Every stanza of the dpkg database under ROOT, as a dict of its fields."""
    records = []
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
            records.append(fields)
    return records


def dpkg_status(root):
    """{package: depends} of the installed packages of the dpkg database under ROOT."""
    return {r["Package"]: r.get("Depends", "") for r in dpkg_records(root) if r.get("Status", "").endswith(" installed")}


def broken(root):
    states = ("half-installed", "unpacked", "half-configured", "triggers-awaited", "triggers-pending")
    return [[r["Package"], r["Status"].split()[-1]] for r in dpkg_records(root)
            if r.get("Status", "").split()[-1:] and r["Status"].split()[-1] in states]


def journal(root):
    updates = os.path.join(root, "var/lib/dpkg/updates")
    try:
        return sorted(name for name in os.listdir(updates) if name.isdigit())
    except OSError:
        return []


def version_key(version):
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"[.-]", version)]


def flavour(kernel):
    return re.sub(r"^[0-9.]+-[0-9]+-", "", kernel)


def names_kernel(dep, kernel):
    return re.search(r"(^|[ ,|])linux-image-(unsigned-)?%s([ ,(|]|$)" % re.escape(kernel), dep)


def kernel_meta(installed, kernel):
    """The meta that names the running kernel; with a kernel update pending (the meta names the
    new kernel), the one naming an installed kernel of the same flavour and line (major.minor:
    6.11 for HWE, 6.8 for GA), the newest; else one whose name holds the flavour."""
    metas = {name: dep for name, dep in installed.items()
             if name.startswith("linux-image-") and not VERSIONED.match(name)}
    for name, dep in sorted(metas.items()):
        if names_kernel(dep, kernel):
            return name
    line = ".".join(kernel.split(".")[:2])
    pending = sorted(((version_key(k), name) for name, dep in metas.items()
                      for k in (VERSIONED.match(n).group(1) for n in installed if VERSIONED.match(n))
                      if flavour(k) == flavour(kernel) and k.startswith(line + ".") and names_kernel(dep, k)))
    if pending:
        return pending[-1][1]
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


def main(root, sys_module_dir, kernel, our_blacklist, driver_regex="^$"):
    installed = dpkg_status(root)
    versions = {r["Package"]: r.get("Version", "") for r in dpkg_records(root)
                if r.get("Status", "").endswith(" installed")}
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
        "driver_packages": [[name, versions[name]] for name in sorted(installed) if re.search(driver_regex, name)],
        "broken_packages": broken(root),
        "dpkg_journal": journal(root),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
