"""Inventories that point at the loopback sshd (tests/sshd.py), for the SSH and remote-validation tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml


def write_inventory(directory: Path, server, *, name: str = "lo", **overrides) -> Path:
    """A one-host inventory for ``server`` (a LoopbackSSHD). ``overrides`` replace host variables.

    The "box venv" is ``directory/venv`` (:func:`box_venv`: torch, triton and dsv4kit importable
    there, as in the box's SGLang venv); the state dir is a private directory under ``directory``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    venv = box_venv(directory / "venv")
    host = {
        "ansible_host": server.host,
        "ansible_port": server.port,
        "ansible_user": server.user,
        "ansible_ssh_private_key_file": str(server.client_key),
        "dsv4_known_hosts": str(server.known_hosts),
        "dsv4_connect_timeout": 10,
        "dsv4_venv_dir": str(venv),
        "dsv4_state_dir": str(directory / "state"),
        "dsv4_context_length": 8192,
        "dsv4_decode_port": 30002,
        "dsv4_gpu_count": 8,
    }
    for key, value in overrides.items():
        if value is None:
            host.pop(key, None)
        else:
            host[key] = value
    if host.get("ansible_port") != server.port and "dsv4_known_hosts" not in overrides:
        # Another port (a closed one, say): the server's key is known there too, so dsv4kit's
        # known_hosts check before connecting lets the run reach the connection attempt.
        known = directory / "known_hosts"
        known.write_text(server.host_key_line().replace(f":{server.port} ", f":{host['ansible_port']} "))
        host["dsv4_known_hosts"] = str(known)
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"boxes": {"hosts": {name: host}}}}}))
    return path


def box_venv(venv: Path) -> Path:
    """A stand-in for the box's SGLang venv: a real venv (``pyvenv.cfg``, ``bin/python`` -> the base
    interpreter) whose one ``.pth`` adds this interpreter's site-packages as a site directory, so
    torch, triton and the installed dsv4kit are importable there as in the box's SGLang venv.

    Its files are :data:`BOX_VENV_LAYOUT`. (A bare ``bin/python`` symlink to ``sys.executable``
    is not a venv: from a venv, Python resolves it to the base interpreter, which lacks torch.)
    """
    python = venv / "bin" / "python"
    if python.exists():
        return venv
    site_dir = venv / _SITE_PACKAGES
    site_dir.mkdir(parents=True, exist_ok=True)
    python.parent.mkdir(exist_ok=True)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    (venv / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    python.symlink_to(base)
    purelib = sysconfig.get_paths()["purelib"]
    (site_dir / "dsv4kit_test_box.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    return venv


_SITE_PACKAGES = Path("lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
#: What :func:`box_venv` writes, relative to the venv (a test checks the venv is left as it was).
BOX_VENV_LAYOUT = sorted(["bin", "bin/python", "pyvenv.cfg", "lib", str(_SITE_PACKAGES.parent),
                          str(_SITE_PACKAGES), str(_SITE_PACKAGES / "dsv4kit_test_box.pth")])


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def venv_without_pip(dest: Path) -> Path:
    """A real venv made ``--without-pip`` (as uv makes them) that sees this interpreter's packages
    (torch, triton) but neither pip nor the editable dsv4kit: through a ``.pth`` line to a
    directory of symlinks."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    farm = dest / "system-packages"
    farm.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if name.startswith(("pip", "dsv4kit", "__editable__", "_distutils_hack")) or name.endswith(".pth"):
            continue
        (farm / entry.name).symlink_to(entry)
    purelib = subprocess.run([str(dest / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "system_packages.pth").write_text(f"{farm}\n")
    return dest


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
