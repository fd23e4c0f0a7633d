"""A GPU box's package manager and driver tools, stood in for on this machine (provisioning tests).

Real apt and dpkg, pointed at a scratch root by APT_CONFIG/DPKG_ROOT: real sources parsing (two
Signed-By values for one repository make apt refuse every command, as on a real box), real
apt_preferences, holds, GPG-signed flat repositories built from tiny .deb packages (dpkg-deb), and
maintainer scripts that run (DKMS's build is a postinst that needs the headers of the running
kernel). nvidia-smi, modprobe, modinfo, dkms, dmesg and mokutil are shell stand-ins on PATH that
behave like the real ones: no module without a DKMS build, a module refused under Secure Boot unless
Canonical signed it, nvidia-smi failing until the module is loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

KERNEL = platform.release()
BRANCH = "580"
CUDA_VERSION = "580.95.05-0ubuntu1"
NEWER_CUDA_VERSION = "580.105.08-0ubuntu1"  # what an unattended upgrade would pull
UBUNTU_VERSION = "580.126.09-0ubuntu0.24.04.1"  # Ubuntu's build of the same names, a higher version
OPEN_MODULE = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {CUDA_VERSION.split('-')[0]}  Release Build"
DKMS_POSTINST = """#!/bin/sh
# DKMS: build the module against the running kernel's headers (it prints an error and carries on without them).
set -e
if [ "$1" = configure ]; then
  log="$DPKG_ROOT/var/lib/dkms/nvidia/{version}/build/make.log"
  mkdir -p "$(dirname "$log")"
  if [ -e "$DPKG_ROOT/lib/modules/{kernel}/build" ]; then
    mkdir -p "$DPKG_ROOT/lib/modules/{kernel}/updates/dkms"
    echo unsigned > "$DPKG_ROOT/lib/modules/{kernel}/updates/dkms/nvidia.ko"
    echo "make: building nvidia.ko for {kernel}: done" > "$log"
  else
    echo "Error! Your kernel headers for kernel {kernel} cannot be found at /lib/modules/{kernel}/build" >&2
  fi
fi
exit 0
"""


@dataclass
class Deb:
    name: str
    version: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    depends: str = ""
    postinst: str | None = None


class FakeGPUBox:
    """Scratch root ``root`` (the inventory's dsv4_prefix) with apt, dpkg and driver tools stood in."""

    def __init__(self, work: Path, root: Path, gpus: int = 8):
        self.work, self.root, self.gpus = work, root, gpus
        self.bin, self.state = work / "bin", work / "state"
        self.gnupg = work / "gnupg"
        for d in (self.bin, self.state, root / "var/lib/dpkg/updates", root / "var/lib/dpkg/info",
                  root / "var/lib/apt/lists/partial", root / "var/cache/apt/archives/partial", root / "var/log/apt",
                  root / "etc/apt/sources.list.d", root / "etc/apt/preferences.d", root / "etc/apt/apt.conf.d",
                  root / "usr/share/keyrings"):
            d.mkdir(parents=True, exist_ok=True)
        (root / "var/lib/dpkg/status").touch()
        self.apt_conf = work / "apt.conf"
        self.apt_conf.write_text("\n".join([
            f'Dir "{root}/";',
            f'Dir::State::status "{root}/var/lib/dpkg/status";',
            f'DPkg::Options {{ "--root={root}"; "--admindir={root}/var/lib/dpkg"; "--force-script-chrootless"; }};',
            'APT::Sandbox::User "root";', ""]))
        self.gnupg.mkdir(mode=0o700, exist_ok=True)
        self._gpg("--quick-gen-key", "dsv4kit test archive", "ed25519", "sign", "never")
        self.key = work / "archive-key.gpg"
        self.key.write_bytes(subprocess.run(["gpg", "--homedir", str(self.gnupg), "--export"], check=True,
                                            capture_output=True).stdout)
        self.cuda_repo = work / "compute/cuda/repos/debian12/x86_64"
        self.ubuntu_repo = work / "ubuntu"
        self.keyring = root / "usr/share/keyrings/cuda-archive-keyring.gpg"
        self._write_tools()

    # --- apt/dpkg ---------------------------------------------------------------------------------
    def environment(self) -> dict:
        path = f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, "APT_CONFIG": str(self.apt_conf), "DPKG_ROOT": str(self.root),
                "DPKG_ADMINDIR": str(self.root / "var/lib/dpkg"), "DPKG_FORCE": "script-chrootless",
                "DEBIAN_FRONTEND": "noninteractive"}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """apt-get, apt-cache, dpkg-query ... inside the scratch root."""
        return subprocess.run(list(argv), env={**os.environ, **self.environment()}, capture_output=True,
                              text=True, timeout=300, check=check)

    def _gpg(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["gpg", "--batch", "--homedir", str(self.gnupg), "--pinentry-mode", "loopback",
                               "--passphrase", "", *args], check=True, capture_output=True, **kwargs)

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.gnupg), "--kill", "gpg-agent"], capture_output=True)

    def build_deb(self, deb: Deb, directory: Path) -> Path:
        tree = self.work / "debs" / f"{deb.name}_{deb.version}"
        shutil.rmtree(tree, ignore_errors=True)  # a rebuilt package holds only its own files
        (tree / "DEBIAN").mkdir(parents=True)
        control = [f"Package: {deb.name}", f"Version: {deb.version}", "Architecture: all",
                   "Maintainer: dsv4kit tests <tests@invalid>", f"Description: stand-in for {deb.name}"]
        if deb.depends:
            control.append(f"Depends: {deb.depends}")
        (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
        if deb.postinst:
            (tree / "DEBIAN/postinst").write_text(deb.postinst)
            (tree / "DEBIAN/postinst").chmod(0o755)
        for path, content in deb.files.items():
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
            target.chmod(0o755 if "/bin/" in path else 0o644)
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / f"{deb.name}_{deb.version}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(tree), str(out)], check=True,
                       capture_output=True)
        return out

    def publish(self, directory: Path, debs: list[Deb], origin: str, label: str | None = None) -> None:
        """A signed flat repository ("deb URI /") holding ``debs``, its Release naming ``origin``."""
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("*.deb"):
            old.unlink()
        for deb in debs:
            self.build_deb(deb, directory)
        self._reindex(directory, origin, label or origin)

    def cuda_keyring(self) -> Deb:
        """NVIDIA's cuda-keyring: a one-line source signed by /usr/share/keyrings/cuda-archive-keyring.gpg."""
        return Deb("cuda-keyring", "1.1-1", files={
            "/etc/apt/sources.list.d/cuda-debian12-x86_64.list":
                f"deb [signed-by={self.keyring}] file://{self.cuda_repo}/ /\n",
            "/usr/share/keyrings/cuda-archive-keyring.gpg": self.key.read_bytes(),
        })

    def publish_cuda(self, *, newer: bool = True) -> None:
        v = CUDA_VERSION
        debs = [
            self.cuda_keyring(),
            Deb(f"nvidia-headless-{BRANCH}-open", v, depends=f"nvidia-dkms-{BRANCH}-open (= {v}), nvidia-kernel-common-{BRANCH} (= {v})"),
            Deb(f"nvidia-dkms-{BRANCH}-open", v, postinst=DKMS_POSTINST.format(kernel=KERNEL, version=v.split("-")[0])),
            Deb(f"nvidia-kernel-common-{BRANCH}", v),
            Deb(f"nvidia-utils-{BRANCH}", v),
            Deb("cuda-toolkit-13-0", "13.0.2-1", files={
                "/usr/local/cuda-13.0/bin/nvcc": "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                                                 "echo 'Cuda compilation tools, release 13.0, V13.0.88'\n"}),
        ]
        if newer:  # a point release of the branch and a newer branch: what unattended-upgrades would take
            debs += [Deb(f"nvidia-utils-{BRANCH}", NEWER_CUDA_VERSION), Deb("nvidia-utils-590", "590.48.01-0ubuntu1"),
                     Deb("nvidia-headless-590-open", "590.48.01-0ubuntu1")]
        self.publish(self.cuda_repo, debs, origin="NVIDIA", label="NVIDIA CUDA")

    def _reindex(self, directory: Path, origin: str, label: str) -> None:
        packages = subprocess.run(["dpkg-scanpackages", "-m", "."], cwd=directory, capture_output=True, text=True,
                                  check=True).stdout
        (directory / "Packages").write_text(packages)
        digest = hashlib.sha256(packages.encode()).hexdigest()
        (directory / "Release").write_text(f"Origin: {origin}\nLabel: {label}\nArchitectures: amd64 all\n"
                                           f"SHA256:\n {digest} {len(packages.encode())} Packages\n")
        (directory / "InRelease").unlink(missing_ok=True)
        self._gpg("--clearsign", "-o", str(directory / "InRelease"), str(directory / "Release"))

    def publish_ubuntu(self, *, headers: bool = True, signed_modules: bool = False) -> None:
        """Ubuntu's archive: the running kernel's headers, and the same driver names at a higher version."""
        v = UBUNTU_VERSION
        debs = [Deb(f"nvidia-utils-{BRANCH}", v), Deb(f"nvidia-kernel-common-{BRANCH}", v),
                Deb(f"nvidia-headless-no-dkms-{BRANCH}-open", v, depends=f"nvidia-kernel-common-{BRANCH} (= {v})")]
        if headers:
            debs.append(Deb(f"linux-headers-{KERNEL}", "1.0-1", files={
                f"/lib/modules/{KERNEL}/build/Makefile": "# kernel headers\n"}))
        if signed_modules:
            debs.append(Deb(f"linux-modules-nvidia-{BRANCH}-open-{KERNEL}", "1.0-1",
                            depends=f"nvidia-kernel-common-{BRANCH} (= {v})",
                            files={f"/lib/modules/{KERNEL}/kernel/nvidia-{BRANCH}-open/nvidia.ko": "signed\n"}))
        self.publish(self.ubuntu_repo, debs, origin="Ubuntu")
        ubuntu_key = self.root / "usr/share/keyrings/ubuntu-archive-keyring.gpg"
        ubuntu_key.write_bytes(self.key.read_bytes())
        (self.root / "etc/apt/sources.list.d/ubuntu.sources").write_text(
            f"Types: deb\nURIs: file://{self.ubuntu_repo}/\nSuites: /\nSigned-By: {ubuntu_key}\n")

    # --- driver tools ---------------------------------------------------------------------------------
    @property
    def proc_version(self) -> Path:
        return self.state / "proc-driver-nvidia-version"

    def secure_boot(self, on: bool) -> None:
        (self.state / "sb-state").write_text("SecureBoot enabled\n" if on else "SecureBoot disabled\n")

    def _write_tools(self) -> None:
        modules = f"{self.root}/lib/modules/{KERNEL}"
        gpu_lines = "\n".join(f"GPU {i}: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-{i:08d})"
                              for i in range(self.gpus))
        tools = {
            "mokutil": f'[ "$1" = --sb-state ] && cat {self.state}/sb-state 2>/dev/null || echo "SecureBoot disabled"\n',
            "dmesg": f"cat {self.state}/dmesg 2>/dev/null\n",
            "update-initramfs": "echo 'update-initramfs: Generating /boot/initrd.img'\n",
            "modinfo": (f'ko=$(ls {modules}/updates/dkms/nvidia.ko {modules}/kernel/nvidia-*/nvidia.ko 2>/dev/null | head -n 1)\n'
                        'if [ -z "$ko" ]; then echo "modinfo: ERROR: Module nvidia not found." >&2; exit 1; fi\n'
                        'echo "filename:       $ko"; echo "version:        580.95.05"\n'
                        'grep -q signed "$ko" && ! grep -q unsigned "$ko" && echo "signer:         Canonical Ltd. Kernel Module Signing"\n'
                        'exit 0\n'),
            "dkms": (f'[ -e {modules}/updates/dkms/nvidia.ko ] && echo "nvidia/580.95.05, {KERNEL}, x86_64: installed"\n'
                     f'[ -e {modules}/updates/dkms/nvidia.ko ] || echo "nvidia/580.95.05: added"\nexit 0\n'),
            "modprobe": (f'ko=$(ls {modules}/updates/dkms/nvidia.ko {modules}/kernel/nvidia-*/nvidia.ko 2>/dev/null | head -n 1)\n'
                         f'if [ -z "$ko" ]; then echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/{KERNEL}" >&2; exit 1; fi\n'
                         f'if grep -q "SecureBoot enabled" {self.state}/sb-state 2>/dev/null && grep -q unsigned "$ko"; then\n'
                         f'  echo "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7" >> {self.state}/dmesg\n'
                         '  echo "modprobe: ERROR: could not insert \'nvidia\': Key was rejected by service" >&2; exit 1\nfi\n'
                         f'echo "{OPEN_MODULE}" > {self.proc_version}\n'),
            "nvidia-smi": (f'if [ ! -e {self.proc_version} ]; then\n'
                           '  echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver. '
                           'Make sure that the latest NVIDIA driver is installed and running."; exit 9\nfi\n'
                           f'case "$*" in *persistence_mode*) for i in $(seq {self.gpus}); do echo Enabled; done ;;\n'
                           f'*) cat <<GPUS\n{gpu_lines}\nGPUS\n;; esac\n'),
        }
        for name, body in tools.items():
            path = self.bin / name
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(0o755)
