"""One simulated serving box: the sglang_service role's units and scripts as Ansible renders them,
started by the ``systemctl`` stand-in, with SGLang's and sglang-router's own parsers at the seams.

Under ``prefix`` (the inventory's dsv4_prefix): the units, their environment files, the role's bin
directory, and a venv whose ``bin/python`` is this interpreter with the SGLang 0.5.23 wheel's site
on its path, except that ``-m sglang.launch_server`` runs tests/journey/launch_server_standin.py
and the router launcher runs under tests/journey/router_standin.py; ``sglang.benchmark.serving``
there is SGLang's own client, with torchvision (which a CPU torch cannot load) a stand-in
(tests/standins.py), as in the bench tests' client venv. ``nvidia-smi`` in the venv's bin (first on
the units' PATH) sees 8 GPUs; ``modprobe``/``nvidia-modprobe`` record their calls.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.journey import systemctl_standin
from tests.provision.test_provision_scripts import FAKE_NVIDIA_SMI
from tests.service_units import UNITS, render_units, role_defaults
from tests.sglang_wheel import CLIENT_STANDINS, sglang_site

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _free_ports(count: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


@dataclass
class SimulatedBox:
    root: Path
    overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        self.prefix = self.root / "prefix"
        self.model = self.prefix / "models" / self.overrides.get("dsv4_model", "DeepSeek-V4-Flash")  # as all.yml
        self.tools = self.root / "tools"
        ports = _free_ports(5)
        self.vars = {"dsv4_model_path": str(self.model), "dsv4_router_port": ports[0], "dsv4_prefill_port": ports[1],
                     "dsv4_decode_port": ports[2], "dsv4_disaggregation_bootstrap_port": ports[3],
                     "sglang_service_metrics_port": ports[4], **self.overrides}

    # --- layout -----------------------------------------------------------------------------------
    @property
    def units(self) -> Path:
        return self.prefix / "etc/systemd/system"

    @property
    def venv(self) -> Path:
        return self.prefix / "opt/dsv4/venv"

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "var/lib/dsv4kit/bin"

    def build(self) -> "SimulatedBox":
        render_units(self.prefix, self.vars, scripts=True)
        self.model.mkdir(parents=True, exist_ok=True)
        (self.model / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}\n')
        site = sglang_site()
        standins = self.venv / "standins"
        standins.mkdir(parents=True, exist_ok=True)
        (standins / "sitecustomize.py").write_text(f"from tests.standins import install\ninstall({CLIENT_STANDINS!r})\n")
        python = self.venv / "bin/python"
        python.write_text(
            "#!/bin/sh\n"
            f"export PYTHONPATH={shlex.quote(str(standins))}:{shlex.quote(str(site))}:{shlex.quote(str(REPO))}"
            "${PYTHONPATH:+:$PYTHONPATH}\n"
            f'if [ "$1" = -m ] && [ "$2" = sglang.launch_server ]; then shift 2; '
            f'exec {shlex.quote(sys.executable)} {shlex.quote(str(HERE / "launch_server_standin.py"))} "$@"; fi\n'
            f'case "$1" in */dsv4-router-launch) '
            f'exec {shlex.quote(sys.executable)} {shlex.quote(str(HERE / "router_standin.py"))} "$@";; esac\n'
            f'exec {shlex.quote(sys.executable)} "$@"\n')
        python.chmod(0o755)
        (self.venv / "bin/nvidia-smi").write_text(FAKE_NVIDIA_SMI)
        (self.venv / "bin/nvidia-smi").chmod(0o755)
        self.tools.mkdir(parents=True, exist_ok=True)
        for tool in ("modprobe", "nvidia-modprobe"):
            (self.tools / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {self.root / "module-calls"}\n')
            (self.tools / tool).chmod(0o755)
        self.env = {**os.environ, **systemctl_standin.install(self.tools, self.root / "systemd", self.units),
                    "DSV4KIT_STANDIN_PATH": f"{self.tools}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "PATH": f"{self.tools}:{os.environ['PATH']}"}
        return self

    # --- what the role's tasks run ----------------------------------------------------------------------
    def systemctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["systemctl", *args], env=self.env, capture_output=True, text=True, timeout=400)

    def start_all(self) -> None:
        """tasks/main.yml: reset-failed, then enable and start the units in the role's order."""
        self.systemctl("reset-failed", *UNITS)
        for name in UNITS:
            self.systemctl("enable", name)
            done = self.systemctl("start", name)
            assert done.returncode == 0, f"{name}: {done.stderr}"

    def show(self, name: str) -> dict:
        out = self.systemctl("show", name).stdout
        return dict(line.partition("=")[::2] for line in out.splitlines())

    def server_waits(self, timeout: float = 300) -> list[list[str]]:
        """The health waits of tasks/health.yml for each server, as the role builds their argv."""
        defaults = role_defaults()
        pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
        pins.update(self.vars)
        waits = []
        for server in defaults["sglang_service_servers"]:
            name = f"dsv4-{server['name']}.service"
            port = pins[f"dsv4_{server['name']}_port"]
            argv = [str(self.bin_dir / "dsv4-health-wait"), "--url", f"http://127.0.0.1:{port}",
                    "--timeout", str(timeout), "--interval", "1", "--pid", self.show(name)["MainPID"], "--unit", name,
                    "--expect", f"context_length={pins['dsv4_context_length']}",
                    "--expect", f"version={pins['dsv4_sglang_version']}",
                    "--expect", f"disaggregation_mode={server['name']}"]
            flags = pins["dsv4_kernel_flags"]
            argv += [f"--expect-env={k}={v}" for k, v in flags.items() if v != "auto"]
            waits.append(argv + self.key_args())
        return waits

    def router_wait(self, timeout: float = 300) -> list[str]:
        port = self.vars["dsv4_router_port"]
        return [str(self.bin_dir / "dsv4-health-wait"), "--url", f"http://127.0.0.1:{port}", "--path", "/readiness",
                "--generate", "--unit", "dsv4-router.service",
                "--timeout", str(timeout), "--interval", "1", *self.key_args()]

    def key_args(self) -> list[str]:
        """sglang_service_health_key_args: the router's root-only key file, when there is a key."""
        if not self.vars.get("dsv4_router_api_key"):
            return []
        return ["--api-key-file", str(self.prefix / "etc/dsv4kit/router-secret.env")]

    def wait(self, argv: list[str]) -> tuple[int, dict]:
        done = subprocess.run([sys.executable, *argv], env=self.env, capture_output=True, text=True, timeout=900)
        return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {
            "stderr": done.stderr}

    def pids(self) -> list[int]:
        pids = []
        for name in UNITS:
            state = json.loads((self.root / "systemd" / f"{name}.json").read_text())
            if state.get("pid"):
                pids.append(state["pid"])
        return pids

    def stop_all(self) -> None:
        for name in reversed(UNITS):
            self.systemctl("stop", name)

    def journal(self, name: str) -> str:
        path = self.root / "systemd" / f"{name}.journal"
        return path.read_text() if path.exists() else ""

