"""A GPU box's package manager and driver tools, stood in for on this machine (provisioning tests).

Real apt and dpkg, pointed at a scratch root by APT_CONFIG/DPKG_ROOT: real sources parsing (two
Signed-By values for one repository make apt refuse every command, as on a real box), real
apt_preferences, holds, GPG-signed flat repositories built from tiny .deb packages (dpkg-deb), and
maintainer scripts that run (DKMS's build is a postinst that needs the headers of the running
kernel). nvidia-smi, modprobe, modinfo, dkms, dmesg and mokutil are shell stand-ins on PATH that
behave like the real ones: no module without a DKMS build, a module refused under Secure Boot unless
Canonical signed it, nvidia-smi failing until the module is loaded (and "Driver/library version
mismatch" while another version's module is loaded), nouveau holding the GPUs until it is unloaded.
systemctl stands in for nvidia-persistenced as Ubuntu ships it: a Type=forking unit whose daemon
exits 1 while no NVIDIA module is loaded. /sys/module is a folder of the stand-in state.
"""

from __future__ import annotations

import hashlib
import os
import re
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The box's running kernel, an Ubuntu noble kernel name (the tests hand it to the playbook as
# ansible_kernel: this machine's own kernel name is no Ubuntu flavour's), and the kernel update of
# the same flavour, its ABI number one higher. FakeGPUBox(kernel=None) keeps this machine's.
KERNEL = "6.8.0-90-generic"
NEWER_KERNEL = "6.8.0-91-generic"
FLAVOUR_META = "generic-hwe-24.04"  # the box's linux-image metapackage: linux-image-generic-hwe-24.04
BRANCH = "580"
CUDA_VERSION = "580.95.05-0ubuntu1"
NEWER_CUDA_VERSION = "580.105.08-0ubuntu1"  # what an unattended upgrade would pull
UBUNTU_VERSION = "580.126.09-0ubuntu0.24.04.1"  # Ubuntu's build of the same names, a higher version
# Ubuntu's -server build of the branch: 0ubuntu0.24.04.3, the first with the versioned virtual
# nvidia-kernel-common-580-server-580.95.05 its packages depend on (.2 used an exact-version dependency)
SERVER_VERSION = "580.95.05-0ubuntu0.24.04.3"
UNBRANCHED = "595"  # NVIDIA's 590+ naming: no branch in the names
UNBRANCHED_VERSION = "595.58.03-1"
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
    provides: str = ""
    conflicts: str = ""
    replaces: str = ""
    breaks: str = ""


def upstream(version: str) -> str:
    """The upstream part of a Debian version: 580.126.09 of 580.126.09-0ubuntu0.24.04.1."""
    return version.rsplit("-", 1)[0]


def kernel_version(kernel: str) -> str:
    """The Version field of the signed-module packages of ``kernel`` (6.8.0-90-generic: 6.8.0-90.90+1),
    as apt shows linux-modules-nvidia-580-6.8.0-136-generic at 6.8.0-136.136+1 on noble."""
    base, abi = re.match(r"^([0-9.]+)-([0-9]+)-", kernel).groups()
    return f"{base}-{abi}.{abi}+1"


# The dependency shapes of Ubuntu noble's nvidia-graphics-drivers-580 binaries, kept to the fields
# that decide what apt and dpkg do (Depends with their version bounds, Provides, Conflicts,
# Replaces, Breaks; no ${shlibs}/${misc} expansions, no dkms/adduser/ocl-icd dependencies).
# Source: Canonical's packaging, github.com/canonical/nvidia-graphics-drivers, debian/control of
# branch 580-noble (580.142-0ubuntu0.24.04.1) and 580-server-noble (580.126.20-0ubuntu0.24.04.2),
# which are the same after substituting 580 -> 580-server. The versioned virtual
# nvidia-kernel-common-580-<upstream> (utils, libnvidia-compute and libnvidia-cfg1 depend on it) is
# there from 580.95.05-0ubuntu0.24.04.3 on ("Fix dependencies between packages", LP: #2129682);
# every version string this box publishes for Ubuntu is one of that packaging's later releases. In
# short: nvidia-kernel-common-580 needs the firmware of its own upstream version; the libraries and
# nvidia-utils need that kernel-common (through the versioned virtual), not each other;
# nvidia-dkms and nvidia-headless-no-dkms bound kernel-common to the upstream version
# (>= U, <= U-1); nvidia-headless-580-open needs the no-DKMS set and the DKMS package UNVERSIONED,
# so only the pin and the names given to apt decide their versions. Each package provides and
# conflicts with its branch-less virtual name, so two branches, or a branch and its -server build,
# never stay installed together; the firmware of the two builds of one upstream version break each
# other. Inferred, not read: that NVIDIA's CUDA repository, whose branch-580 packages carry
# Ubuntu's names (at 580.x-0ubuntu1), has the same shapes (this box publishes the same for both).
def driver_debs(version: str, suffix: str = "", dkms_postinst: str | None = None) -> list[Deb]:
    """Branch 580's driver packages at ``version``; ``suffix`` "-server": Ubuntu's server build."""
    b, v, u = BRANCH + suffix, version, upstream(version)
    other = BRANCH if suffix else BRANCH + "-server"
    virtual = lambda *names: dict(provides=", ".join(names), conflicts=", ".join(names), replaces=", ".join(names))  # noqa: E731
    common = f"nvidia-kernel-common-{b} (>= {u}), nvidia-kernel-common-{b} (<= {u}-1)"  # U and U-1: the upstream only
    source = f"nvidia-kernel-source-{b}-open (>= {u}), nvidia-kernel-source-{b}-open (<= {u}-1)"
    return [
        Deb(f"nvidia-kernel-common-{b}", v, depends=f"nvidia-firmware-{b}-{u}",
            provides=f"nvidia-kernel-common, nvidia-kernel-common-{b}-{u}", conflicts="nvidia-kernel-common",
            replaces="nvidia-kernel-common"),
        Deb(f"nvidia-firmware-{b}-{u}", v, breaks=f"nvidia-firmware-{other}-{u}", replaces=f"nvidia-firmware-{other}-{u}"),
        Deb(f"nvidia-kernel-source-{b}-open", v, **virtual("nvidia-kernel-source")),
        Deb(f"libnvidia-compute-{b}", v, depends=f"nvidia-kernel-common-{b}-{u}", **virtual("libnvidia-compute")),
        Deb(f"libnvidia-cfg1-{b}", v, depends=f"nvidia-kernel-common-{b}-{u}", **virtual("libnvidia-cfg1-any")),
        Deb(f"nvidia-compute-utils-{b}", v, depends=f"libnvidia-compute-{b}",
            **virtual("nvidia-compute-utils", "nvidia-persistenced")),
        Deb(f"nvidia-utils-{b}", v, depends=f"nvidia-kernel-common-{b}-{u}", **virtual("nvidia-utils", "nvidia-smi")),
        Deb(f"nvidia-dkms-{b}-open", v, depends=f"{source}, {common}", postinst=dkms_postinst,
            **virtual("nvidia-dkms-kernel")),
        Deb(f"nvidia-headless-no-dkms-{b}-open", v,  # no Provides/Conflicts/Replaces, as in the packaging
            depends=f"{common}, nvidia-kernel-source-{b}-open (= {v}), libnvidia-compute-{b} (= {v}), "
                    f"nvidia-compute-utils-{b} (= {v}), libnvidia-cfg1-{b} (= {v})"),
        Deb(f"nvidia-headless-{b}-open", v, depends=f"nvidia-headless-no-dkms-{b}-open, nvidia-dkms-{b}-open",
            **virtual("nvidia-headless")),
    ]


def nvswitch_debs(branch: str, version: str) -> list[Deb]:
    """Fabric manager and NSCQ of ``branch`` (NVSwitch systems). Not from a real source: the Ubuntu
    archive's fields for these two were not found; each provides and conflicts with its branch-less
    name, as NVIDIA's own packaging of them does."""
    return [Deb(f"nvidia-fabricmanager-{branch}", version, provides="nvidia-fabricmanager", conflicts="nvidia-fabricmanager",
                replaces="nvidia-fabricmanager"),
            Deb(f"libnvidia-nscq-{branch}", version, provides="libnvidia-nscq", conflicts="libnvidia-nscq",
                replaces="libnvidia-nscq")]


# --- the monitoring role's packages ------------------------------------------------------------------
#: The distribution's packages the monitoring role installs; their binaries are this machine's own.
MONITORING_PACKAGES = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
#: NVIDIA's CUDA repository: DCGM 4.5.3 and the exporter 4.8.2 (inventory/group_vars/all.yml's pins).
DCGM_VERSION = "1:4.5.3-1"
DCGM_EXPORTER_VERSION = "4.8.2-1"
GRAFANA_VERSION = "11.6.0"  # Grafana's apt repository names its packages by the upstream version alone
# A package postinst that makes its system user and group the way adduser --system does, but in the
# box's root ($DPKG_ROOT/etc/passwd, /etc/group): this machine's own users are never touched.
USER_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
  mkdir -p "$DPKG_ROOT/etc"; touch "$DPKG_ROOT/etc/passwd" "$DPKG_ROOT/etc/group"
  grep -q "^{user}:" "$DPKG_ROOT/etc/group" || echo "{user}:x:{uid}:" >> "$DPKG_ROOT/etc/group"
  grep -q "^{user}:" "$DPKG_ROOT/etc/passwd" || echo "{user}:x:{uid}:{uid}:{gecos}:{home}:/usr/sbin/nologin" >> "$DPKG_ROOT/etc/passwd"
fi
exit 0
"""


def _installed(package: str) -> tuple[str, list[str]]:
    """``package``'s version and file list as this machine's dpkg has them."""
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True,
                             check=True).stdout.strip()
    files = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True, check=True).stdout.split()
    return version, files


def distribution_monitoring_debs() -> list[Deb]:
    """prometheus, prometheus-alertmanager and prometheus-node-exporter in the shapes of the packages
    installed on this machine (Debian 12's; Ubuntu 22.04's and 24.04's are the same Debian packaging
    at other versions): their version, their systemd unit in /lib/systemd/system (User=prometheus,
    EnvironmentFile=/etc/default/<name>, ExecStart=/usr/bin/<binary> $ARGS), their /etc/default file
    (ARGS="") and packaged configuration as conffiles, their postinst's system user prometheus
    (made in the box's root). Each /usr/bin program is a two-line script that runs this machine's
    real binary of the same path. Left out: the Depends (adduser, libc6, the web UI's libjs-*) and
    the postinst's start of the unit (the role starts the units)."""
    debs = []
    for name in MONITORING_PACKAGES:
        version, files = _installed(name)
        content: dict[str, str | bytes] = {}
        for path in files:
            if path.startswith("/usr/bin/") and os.access(path, os.X_OK):
                content[path] = f'#!/bin/sh\nexec {path} "$@"\n'
            elif (path.startswith(("/lib/systemd/system/", "/usr/lib/systemd/system/")) and path.endswith(".service")) \
                    or path.startswith(("/etc/default/", "/etc/prometheus/")) and Path(path).is_file():
                content[path] = Path(path).read_bytes()
        debs.append(Deb(name, version, files=content, postinst=USER_POSTINST.format(
            user="prometheus", uid=990, gecos="Prometheus daemon", home="/var/lib/prometheus")))
    return debs


class FakeGPUBox:
    """Scratch root ``root`` (the inventory's dsv4_prefix) with apt, dpkg and driver tools stood in.

    ``kernel``: the box's running kernel (KERNEL, handed to the playbook as ansible_kernel by the
    caller); None: this machine's, which is what ansible_kernel is without one."""

    def __init__(self, work: Path, root: Path, gpus: int = 8, kernel: str | None = None):
        self.work, self.root, self.gpus = work, root, gpus
        self.kernel = kernel or platform.release()
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
        # DPKG_FORCE replaces dpkg's default forces: keep them (downgrade, security-mac), as a real box has them.
        path = f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, "APT_CONFIG": str(self.apt_conf), "DPKG_ROOT": str(self.root),
                "DPKG_ADMINDIR": str(self.root / "var/lib/dpkg"), "DPKG_FORCE": "script-chrootless,security-mac,downgrade",
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
        if deb.provides:
            control.append(f"Provides: {deb.provides}")
        for key, value in (("Conflicts", deb.conflicts), ("Replaces", deb.replaces), ("Breaks", deb.breaks)):
            if value:
                control.append(f"{key}: {value}")
        (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
        conffiles = [path for path in deb.files if path.startswith("/etc/")]  # as debhelper marks them
        if conffiles:
            (tree / "DEBIAN/conffiles").write_text("".join(p + "\n" for p in conffiles))
        if deb.postinst:
            (tree / "DEBIAN/postinst").write_text(deb.postinst)
            (tree / "DEBIAN/postinst").chmod(0o755)
        for path, content in deb.files.items():
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
            target.chmod(0o755 if "/bin/" in path else 0o644)
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / f"{deb.name}_{deb.version.split(':')[-1]}_all.deb"  # pool names drop the epoch
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

    def cuda_keyring(self, distro: str = "debian12", repo: Path | None = None) -> Deb:
        """NVIDIA's cuda-keyring (1.1-1 for every distribution): a one-line source signed by the keyring."""
        return Deb("cuda-keyring", "1.1-1", files={
            f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list":
                f"deb [signed-by={self.keyring}] file://{repo or self.cuda_repo}/ /\n",
            "/usr/share/keyrings/cuda-archive-keyring.gpg": self.key.read_bytes(),
        })

    def publish_cuda(self, *, newer: bool = True, unbranched: bool = False, container: str | None = None,
                     dcgm: bool = False) -> None:
        """NVIDIA's CUDA repository: branch 580 in Ubuntu's naming; ``unbranched``: branch 595 in NVIDIA's
        590+ naming (no branch in the names, nvidia-driver-pinning-595); ``container``: the
        nvidia-container-toolkit version it also carries; ``dcgm``: DCGM and its exporter (:meth:`dcgm_debs`)."""
        v = CUDA_VERSION
        debs = [
            self.cuda_keyring(),
            *driver_debs(v, dkms_postinst=DKMS_POSTINST.format(kernel=self.kernel, version=v.split("-")[0])),
            Deb("cuda-toolkit-13-0", "13.0.2-1", files={
                "/usr/local/cuda-13.0/bin/nvcc": "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                                                 "echo 'Cuda compilation tools, release 13.0, V13.0.88'\n"}),
        ]
        if newer:  # a point release of the branch and a newer branch: what unattended-upgrades would take
            n = NEWER_CUDA_VERSION
            debs += [*driver_debs(n, dkms_postinst=DKMS_POSTINST.format(kernel=self.kernel, version=n.split("-")[0])),
                     Deb("nvidia-utils-590", "590.48.01-0ubuntu1"), Deb("nvidia-headless-590-open", "590.48.01-0ubuntu1")]
        if unbranched:
            u = UNBRANCHED_VERSION
            debs += [
                Deb(f"nvidia-driver-pinning-{UNBRANCHED}", u),
                Deb("nvidia-driver-cuda", u, depends=f"nvidia-smi (= {u}), libcuda1 (= {u}), nvidia-persistenced (= {u})"),
                Deb("nvidia-kernel-open-dkms", u, depends=f"nvidia-kernel-common (= {u})",
                    postinst=DKMS_POSTINST.format(kernel=self.kernel, version=u.split("-")[0])),
                Deb("nvidia-kernel-common", u), Deb("nvidia-smi", u), Deb("libcuda1", u), Deb("nvidia-persistenced", u),
                # the next branch, in the same names: only the pin keeps it out
                Deb("nvidia-driver-cuda", "600.10-1"), Deb("nvidia-smi", "600.10-1"),
            ]
        if container:
            debs += [Deb("nvidia-container-toolkit", container, depends=f"nvidia-container-toolkit-base (= {container})"),
                     Deb("nvidia-container-toolkit-base", container), Deb("libnvidia-container1", container),
                     Deb("libnvidia-container-tools", container, depends=f"libnvidia-container1 (= {container})")]
        if dcgm:
            debs += self.dcgm_debs()
        self.publish(self.cuda_repo, debs, origin="NVIDIA", label="NVIDIA CUDA")

    def dcgm_debs(self) -> list[Deb]:
        """datacenter-gpu-manager-4-core and datacenter-gpu-manager-exporter at the pinned versions.
        Their fields are not read from NVIDIA's packages (no archive this machine may reach has them):
        DCGM's host engine unit nvidia-dcgm.service, nv-hostengine and dcgmi (which, as on a card
        without profiling support, lists no profiling field); the exporter's /usr/bin/dcgm-exporter
        runs the DCGM exporter stand-in (tests/fake_exporters.py: the pinned exporter's names) with
        the real exporter's --address, --collectors and --remote-hostengine-info flags."""
        py, exporters = shlex.quote(sys.executable), shlex.quote(str(Path(__file__).resolve().parent / "fake_exporters.py"))
        return [
            Deb("datacenter-gpu-manager-4-core", DCGM_VERSION, files={
                "/usr/lib/systemd/system/nvidia-dcgm.service": (
                    "[Unit]\nDescription=NVIDIA DCGM service\n\n[Service]\nUser=root\n"
                    "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm\nRestart=on-abort\n\n"
                    "[Install]\nWantedBy=multi-user.target\n"),
                "/usr/bin/nv-hostengine": "#!/bin/sh\nexec sleep infinity\n",
                "/usr/bin/dcgmi": ('#!/bin/sh\n[ "$1" = profile ] && { echo "Error: Profiling is not supported for this '
                                   'group of GPUs or GPU."; exit 255; }\nexit 0\n')}),
            Deb("datacenter-gpu-manager-exporter", DCGM_EXPORTER_VERSION,
                depends=f"datacenter-gpu-manager-4-core (>= {DCGM_VERSION.split('-')[0]})", files={
                    "/usr/bin/dcgm-exporter": f'#!/bin/sh\nexec {py} {exporters} dcgm --max-lifetime 86400 "$@"\n',
                    "/etc/dcgm-exporter/default-counters.csv": "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"}),
        ]

    def publish_grafana(self) -> None:
        """Grafana's apt repository (``deb <url> stable main``, under ``grafana_repo``) signed by the
        ASCII-armoured key it publishes (``grafana_key``), holding ``grafana`` at GRAFANA_VERSION. The package's shape (not read from Grafana's .deb,
        which no archive this machine may reach has): grafana-server.service in /lib/systemd/system
        (User=grafana, EnvironmentFile=/etc/default/grafana-server, ExecStart=
        /usr/share/grafana/bin/grafana server --config=${CONF_FILE} ... cfg:default.paths.*), the
        /etc/default file naming /etc/grafana/grafana.ini, a packaged grafana.ini (a conffile) and a
        postinst that makes the grafana user and group. Grafana itself cannot run here: its binary is
        tests/journey/grafana_standin.py, which loads the provisioned datasource and dashboards as
        Grafana would and serves /api/health and /api/search."""
        py = shlex.quote(sys.executable)
        standin = shlex.quote(str(Path(__file__).resolve().parent / "journey/grafana_standin.py"))
        default = ("GRAFANA_USER=grafana\nGRAFANA_GROUP=grafana\nGRAFANA_HOME=/usr/share/grafana\n"
                   "LOG_DIR=/var/log/grafana\nDATA_DIR=/var/lib/grafana\nMAX_OPEN_FILES=10000\n"
                   "CONF_DIR=/etc/grafana\nCONF_FILE=/etc/grafana/grafana.ini\nRESTART_ON_UPGRADE=true\n"
                   "PLUGINS_DIR=/var/lib/grafana/plugins\nPROVISIONING_CFG_DIR=/etc/grafana/provisioning\n"
                   "PID_FILE_DIR=/run/grafana\n")
        unit = ("[Unit]\nDescription=Grafana instance\nDocumentation=http://docs.grafana.org\n"
                "Wants=network-online.target\nAfter=network-online.target postgresql.service mariadb.service mysql.service\n\n"
                "[Service]\nEnvironmentFile=/etc/default/grafana-server\nUser=grafana\nGroup=grafana\nType=simple\n"
                "Restart=on-failure\nWorkingDirectory=/usr/share/grafana\nRuntimeDirectory=grafana\nRuntimeDirectoryMode=0750\n"
                "ExecStart=/usr/share/grafana/bin/grafana server --config=${CONF_FILE} "
                "--pidfile=${PID_FILE_DIR}/grafana-server.pid --packaging=deb cfg:default.paths.logs=${LOG_DIR} "
                "cfg:default.paths.data=${DATA_DIR} cfg:default.paths.plugins=${PLUGINS_DIR} "
                "cfg:default.paths.provisioning=${PROVISIONING_CFG_DIR}\n"
                "LimitNOFILE=10000\nTimeoutStopSec=20\n\n[Install]\nWantedBy=multi-user.target\n")
        deb = Deb("grafana", GRAFANA_VERSION, files={
            "/lib/systemd/system/grafana-server.service": unit,
            "/etc/default/grafana-server": default,
            "/etc/grafana/grafana.ini": "[paths]\n;data = /var/lib/grafana\n",
            "/usr/share/grafana/bin/grafana": f'#!/bin/sh\nexec {py} {standin} --root {shlex.quote(str(self.root))} "$@"\n',
        }, postinst=USER_POSTINST.format(user="grafana", uid=991, gecos="Grafana", home="/usr/share/grafana"))
        # a suite repository as apt.grafana.com is: dists/stable/main, the package under pool/
        pool = self.grafana_repo / "pool/main/g/grafana"
        shutil.rmtree(self.grafana_repo, ignore_errors=True)
        self.build_deb(deb, pool)
        packages = subprocess.run(["dpkg-scanpackages", "-m", "pool"], cwd=self.grafana_repo, capture_output=True,
                                  text=True, check=True).stdout
        index = self.grafana_repo / "dists/stable/main/binary-amd64/Packages"
        index.parent.mkdir(parents=True)
        index.write_text(packages)
        dist = self.grafana_repo / "dists/stable"
        (dist / "Release").write_text(
            "Origin: Grafana\nLabel: Grafana\nSuite: stable\nCodename: stable\nArchitectures: amd64 arm64 armhf\n"
            f"Components: main\nSHA256:\n {hashlib.sha256(packages.encode()).hexdigest()} {len(packages.encode())} "
            "main/binary-amd64/Packages\n")
        self._gpg("--clearsign", "-o", str(dist / "InRelease"), str(dist / "Release"))
        armored = subprocess.run(["gpg", "--homedir", str(self.gnupg), "--armor", "--export"], check=True,
                                 capture_output=True).stdout
        self.grafana_key.write_bytes(armored)

    @property
    def grafana_repo(self) -> Path:
        return self.work / "grafana"

    @property
    def grafana_key(self) -> Path:
        return self.work / "grafana-gpg.key"

    def publish_distribution_monitoring(self) -> None:
        """The distribution's archive with the monitoring role's packages added (:func:`distribution_monitoring_debs`):
        a second signed flat repository of the box's distribution, beside the one publish_ubuntu writes."""
        repo = self.work / "distribution-monitoring"
        self.publish(repo, distribution_monitoring_debs(), origin="Debian")
        key = self.root / "usr/share/keyrings/distribution-monitoring-keyring.gpg"
        key.write_bytes(self.key.read_bytes())
        (self.root / "etc/apt/sources.list.d/distribution-monitoring.sources").write_text(
            f"Types: deb\nURIs: file://{repo}/\nSuites: /\nSigned-By: {key}\n")

    def install_now(self, debs: list[Deb], check: bool = True) -> None:
        """What the box already has: packages installed with dpkg before any provision (``check``
        False: a failing maintainer script leaves its package half-configured, as on a real box)."""
        paths = [str(self.build_deb(deb, self.work / "preinstalled")) for deb in debs]
        self.run("dpkg", "--root", str(self.root), "--admindir", str(self.root / "var/lib/dpkg"),
                 "--force-script-chrootless", "--force-depends", "-i", *paths, check=check)

    def kernel_debs(self, kernel: str) -> list[Deb]:
        return [Deb(f"linux-image-{kernel}", "1.0-1"),
                Deb(f"linux-headers-{kernel}", "1.0-1", files={f"/lib/modules/{kernel}/build/Makefile": "# kernel headers\n"})]

    def _reindex(self, directory: Path, origin: str, label: str) -> None:
        packages = subprocess.run(["dpkg-scanpackages", "-m", "."], cwd=directory, capture_output=True, text=True,
                                  check=True).stdout
        (directory / "Packages").write_text(packages)
        digest = hashlib.sha256(packages.encode()).hexdigest()
        (directory / "Release").write_text(f"Origin: {origin}\nLabel: {label}\nArchitectures: amd64 all\n"
                                           f"SHA256:\n {digest} {len(packages.encode())} Packages\n")
        (directory / "InRelease").unlink(missing_ok=True)
        self._gpg("--clearsign", "-o", str(directory / "InRelease"), str(directory / "Release"))

    def publish_ubuntu(self, *, headers: bool = True, signed_modules: bool = False, newest: str | None = None,
                       old_kernels: tuple[str, ...] = (), unbranched: bool = False,
                       newest_driver: str | None = None) -> None:
        """Ubuntu's archive: kernels of the flavour up to ``newest`` with their flavour metapackages, the
        same driver names at a higher version, and (``signed_modules``) Canonical's signed modules in
        their real shape: linux-modules-nvidia-580-open-<kernel> needs the upstream version of
        nvidia-kernel-common-580 it was built against, so the packages of ``old_kernels`` need a version
        no longer published, and the flavour metapackage linux-modules-nvidia-580-open-<flavour> names the
        newest kernel's.
        ``newest_driver``: a driver point release published with the newest kernel, whose signed module
        was built against it (Canonical rebuilds a kernel update's modules against the current driver)."""
        v = UBUNTU_VERSION
        debs = driver_debs(v) + driver_debs(SERVER_VERSION, "-server") + (driver_debs(newest_driver) if newest_driver else [])
        # Ubuntu's driver packages blacklist nouveau themselves
        next(deb for deb in debs if deb.name == f"nvidia-kernel-common-{BRANCH}").files[
            "/usr/lib/modprobe.d/nvidia-graphics-drivers.conf"] = (
            "blacklist nouveau\nblacklist lbm-nouveau\noptions nouveau modeset=0\nalias nouveau off\n")
        if unbranched:  # Ubuntu's own 595 build, names with the branch
            debs += [Deb(f"nvidia-utils-{UNBRANCHED}", "595.71.05-0ubuntu0.24.04.1"),
                     Deb(f"nvidia-headless-{UNBRANCHED}-open", "595.71.05-0ubuntu0.24.04.1")]
        newest = newest or self.kernel
        kernels = sorted({self.kernel, newest, *old_kernels})
        for kernel in kernels:
            debs += [deb for deb in self.kernel_debs(kernel) if headers or not deb.name.startswith("linux-headers")]
        debs += [Deb(f"linux-image-{FLAVOUR_META}", newest, depends=f"linux-image-{newest}")]
        if headers:
            debs.append(Deb(f"linux-headers-{FLAVOUR_META}", newest, depends=f"linux-headers-{newest}"))
        if signed_modules:
            # linux-restricted-modules' packages (its packaging is not published; from apt's output on
            # noble boxes): linux-modules-nvidia-580-open-<kernel>, versioned as the kernel, needs its
            # kernel and the upstream version of nvidia-kernel-common-580 its module was built against,
            # (>= U) and (<= U-1); the open variant has no linux-signatures or linux-objects package.
            # The flavour metapackage needs the current kernel's module package at its exact version;
            # its Provides are inferred from jammy's linux-modules-nvidia-595-generic-hwe-22.04 stanza
            # (nvidia-dkms-595 (= the driver's version), nvidia-prebuilt-kernel).
            built = {}
            for kernel in kernels:
                common = "580.82.07-0ubuntu0.24.04.1" if kernel in old_kernels else v  # an old build, since superseded
                if newest_driver and kernel == newest and kernel != self.kernel:
                    common = newest_driver
                built[kernel] = common
                u = upstream(common)
                debs.append(Deb(f"linux-modules-nvidia-{BRANCH}-open-{kernel}", kernel_version(kernel),
                                depends=f"linux-image-{kernel}, "
                                        f"nvidia-kernel-common-{BRANCH} (>= {u}), nvidia-kernel-common-{BRANCH} (<= {u}-1)",
                                files={f"/lib/modules/{kernel}/kernel/nvidia-{BRANCH}-open/nvidia.ko": "signed\n"}))
            debs.append(Deb(f"linux-modules-nvidia-{BRANCH}-open-{FLAVOUR_META}", kernel_version(newest),
                            depends=f"linux-modules-nvidia-{BRANCH}-open-{newest} (= {kernel_version(newest)})",
                            provides=f"nvidia-dkms-{BRANCH}-open (= {built[newest]}), nvidia-prebuilt-kernel"))
        self.publish(self.ubuntu_repo, debs, origin="Ubuntu")
        ubuntu_key = self.root / "usr/share/keyrings/ubuntu-archive-keyring.gpg"
        ubuntu_key.write_bytes(self.key.read_bytes())
        (self.root / "etc/apt/sources.list.d/ubuntu.sources").write_text(
            f"Types: deb\nURIs: file://{self.ubuntu_repo}/\nSuites: /\nSigned-By: {ubuntu_key}\n")

    def boot_kernel(self, kernel: str | None = None) -> None:
        """The running kernel and its flavour metapackage, installed as on any Ubuntu box."""
        kernel = kernel or self.kernel
        self.install_now([Deb(f"linux-image-{kernel}", "1.0-1"),
                          Deb(f"linux-image-{FLAVOUR_META}", kernel, depends=f"linux-image-{kernel}")])

    # --- driver tools ---------------------------------------------------------------------------------
    @property
    def proc_version(self) -> Path:
        return self.state / "proc-driver-nvidia-version"

    @property
    def sys_module(self) -> Path:
        return self.state / "sys-module"

    def secure_boot(self, on: bool) -> None:
        (self.state / "sb-state").write_text("SecureBoot enabled\n" if on else "SecureBoot disabled\n")

    def load_nouveau(self, in_use: bool = False) -> None:
        """nouveau bound to the GPUs (a fresh install); ``in_use``: a console on it, so it cannot be unloaded."""
        (self.sys_module / "nouveau").mkdir(parents=True, exist_ok=True)
        (self.sys_module / "nouveau/refcnt").write_text("1\n" if in_use else "0\n")

    def load_driver(self, version: str) -> None:
        """The box runs another driver: its (open) module is loaded."""
        self.proc_version.write_text(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build\n")

    def systemctl_log(self) -> list[str]:
        log = self.state / "systemctl.log"
        return log.read_text().splitlines() if log.exists() else []

    def _write_tools(self) -> None:
        gpu_lines = "\n".join(f"GPU {i}: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-{i:08d})"
                              for i in range(self.gpus))
        state, root, mods = self.state, self.root, self.state / "sys-module"
        find_ko = (f'ko=$(ls {root}/lib/modules/$k/updates/dkms/nvidia.ko {root}/lib/modules/$k/kernel/nvidia-*/nvidia.ko '
                   '2>/dev/null | head -n 1)\n')
        # The installed nvidia-smi's driver version (nvidia-utils-580 or NVIDIA's nvidia-smi package).
        installed_version = ('installed=$(dpkg-query -W -f \'${Version}\\n\' nvidia-utils-580 nvidia-smi 2>/dev/null '
                             '| grep . | head -n 1 | cut -d- -f1)\n')
        uvm_load = (f'mkdir -p {mods}/nvidia_uvm/parameters; echo 0 > {mods}/nvidia_uvm/refcnt\n'
                    f'if cat {root}/etc/modprobe.d/*.conf 2>/dev/null | grep -q "^options nvidia_uvm.*uvm_disable_hmm=1"; '
                    f'then echo Y; else echo N; fi > {mods}/nvidia_uvm/parameters/uvm_disable_hmm\n')
        tools = {
            "mokutil": (f'if [ "$1" = --test-key ]; then if [ -e "$2" ] && grep -qxF "$2" {state}/mok-enrolled 2>/dev/null; '
                        'then echo "$2 is already enrolled"; exit 0; fi\n'
                        '  [ -e "$2" ] || { echo "Failed to read $2" >&2; exit 255; }; echo "$2 is not enrolled"; exit 1; fi\n'
                        f'[ "$1" = --sb-state ] && cat {state}/sb-state 2>/dev/null || echo "SecureBoot disabled"\n'),
            "dmesg": f"cat {state}/dmesg 2>/dev/null\n",
            # $state/initramfs-fail: the rebuild fails as on a full /boot.
            "update-initramfs": (f'echo "update-initramfs $*" >> {state}/initramfs.log; echo "update-initramfs: Generating /boot/initrd.img"\n'
                                 f'if [ -e {state}/initramfs-fail ]; then echo "cpio: write error: No space left on device" >&2\n'
                                 '  echo "E: mkinitramfs failure cpio 141 gzip 1" >&2; exit 1; fi\n'),
            "modinfo": ('k=' + self.kernel + '; [ "$1" = -k ] && { k="$2"; shift 2; }\n' + find_ko +
                        'if [ -z "$ko" ]; then echo "modinfo: ERROR: Module nvidia not found." >&2; exit 1; fi\n'
                        'if [ "$1" = -F ]; then echo "$ko"; exit 0; fi\n'
                        'echo "filename:       $ko"; echo "version:        580.95.05"\n'
                        'grep -q signed "$ko" && ! grep -q unsigned "$ko" && echo "signer:         Canonical Ltd. Kernel Module Signing"\n'
                        'exit 0\n'),
            "dkms": (f'[ -e {root}/lib/modules/{self.kernel}/updates/dkms/nvidia.ko ] && echo "nvidia/580.95.05, {self.kernel}, x86_64: installed"\n'
                     f'[ -e {root}/lib/modules/{self.kernel}/updates/dkms/nvidia.ko ] || echo "nvidia/580.95.05: added"\nexit 0\n'),
            "modprobe": (
                'k=' + self.kernel + '\n'
                'case "$*" in\n'
                f'"-r nouveau") [ -d {mods}/nouveau ] || exit 0\n'
                f'  if [ "$(cat {mods}/nouveau/refcnt)" != 0 ]; then echo "modprobe: FATAL: Module nouveau is in use." >&2; exit 1; fi\n'
                f'  rm -rf {mods}/nouveau; exit 0 ;;\n'
                f'"-r nvidia_uvm") [ -d {mods}/nvidia_uvm ] || exit 0\n'
                f'  if [ "$(cat {mods}/nvidia_uvm/refcnt)" != 0 ]; then echo "modprobe: FATAL: Module nvidia_uvm is in use." >&2; exit 1; fi\n'
                f'  rm -rf {mods}/nvidia_uvm; exit 0 ;;\n'
                f'nvidia_uvm|nvidia-uvm) [ -e {self.proc_version} ] || exit 1; [ -d {mods}/nvidia_uvm ] && exit 0\n' + uvm_load +
                '  exit 0 ;;\nesac\n' + find_ko +
                f'if [ -z "$ko" ]; then echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/{self.kernel}" >&2; exit 1; fi\n'
                f'if grep -q "SecureBoot enabled" {state}/sb-state 2>/dev/null && grep -q unsigned "$ko"; then\n'
                f'  echo "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7" >> {state}/dmesg\n'
                '  echo "modprobe: ERROR: could not insert \'nvidia\': Key was rejected by service" >&2; exit 1\nfi\n'
                f'if [ -d {mods}/nouveau ]; then\n'
                f'  echo "NVRM: The NVIDIA probe routine was not called for {self.gpus} device(s)." >> {state}/dmesg\n'
                f'  echo "NVRM: This can occur when another driver was loaded and obtained ownership of the NVIDIA device(s)." >> {state}/dmesg\n'
                '  echo "modprobe: ERROR: could not insert \'nvidia\': No such device" >&2; exit 1\nfi\n'
                + installed_version +
                f'echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  ${{installed:-580.95.05}}  Release Build" > {self.proc_version}\n'
                # udev loads nvidia-uvm as soon as the driver binds, with whatever options modprobe.d has then
                + uvm_load),
            "nvidia-smi": (f'if [ ! -e {self.proc_version} ]; then\n'
                           '  echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver. '
                           'Make sure that the latest NVIDIA driver is installed and running."; exit 9\nfi\n'
                           + installed_version +
                           f'if [ -n "$installed" ] && ! grep -q " $installed " {self.proc_version}; then\n'
                           '  echo "Failed to initialize NVML: Driver/library version mismatch"; exit 18\nfi\n'
                           f'case "$*" in *persistence_mode*) for i in $(seq {self.gpus}); do\n'
                           f'  [ -e {state}/persistenced-running ] && echo Enabled || echo Disabled; done ;;\n'
                           f'*) cat <<GPUS\n{gpu_lines}\nGPUS\n;; esac\n'),
            # Ubuntu's nvidia-persistenced.service: Type=forking; the daemon drops to its user, queries
            # the devices and exits 1 when no NVIDIA module is loaded.
            "systemctl": (f'echo "$*" >> {state}/systemctl.log\n'
                          'unit=$(echo "$@" | tr " " "\\n" | grep -v "^-" | tail -n 1 | tr -d "\'")\n'
                          f'running() {{ [ -e {state}/persistenced-running ]; }}\n'
                          'case "$1" in\n'
                          'show) echo "Id=$unit.service"; echo "LoadState=loaded"; echo "Type=forking"\n'
                          '  if running; then echo ActiveState=active; echo SubState=running; else echo ActiveState=failed; echo SubState=failed; fi ;;\n'
                          f'is-enabled) if [ -e {state}/persistenced-enabled ]; then echo enabled; else echo disabled; exit 1; fi ;;\n'
                          f'enable) touch {state}/persistenced-enabled ;;\n'
                          'daemon-reload|list-unit-files) ;;\n'
                          'is-active) running && echo active || { echo failed; exit 3; } ;;\n'
                          f'start|restart) if [ ! -e {self.proc_version} ]; then\n'
                          '    echo "Job for nvidia-persistenced.service failed because the control process exited with error code." >&2\n'
                          f'    echo "nvidia-persistenced: Failed to query NVIDIA devices. Please ensure that the NVIDIA device files (/dev/nvidia*) exist" >> {state}/dmesg\n'
                          f'    rm -f {state}/persistenced-running; exit 1; fi\n'
                          f'  touch {state}/persistenced-running ;;\n'
                          'esac\nexit 0\n'),
        }
        for name, body in tools.items():
            path = self.bin / name
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(0o755)
