"""The sglang_service units as Ansible renders them, judged by systemd's own tools: `systemd-analyze
verify` (any warning fails, as verify_units.py now says), `systemd-analyze security --offline` per
unit against a budget, the router's stricter sandbox, nvidia_uvm loaded before the GPU servers, and
no socket or secret left open: MC_TCP_BIND_ADDRESS, loopback bootstrap, the servers' API key in a
file, the router's key out of every command line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service_units import ROLE, UNITS, render_units, role_defaults

VERIFY = ROLE / "files/verify_units.py"
KEY = "sk-test-router-key-9d1"

#: `systemd-analyze security --offline` exposure per unit (systemd 252; lower is better). A change
#: that raises one fails here: lower the number when a unit gets stricter.
SECURITY_BUDGET = {"dsv4-nvidia-uvm.service": 3.8, "dsv4-prefill.service": 3.2, "dsv4-decode.service": 3.2,
                   "dsv4-router.service": 1.7}

needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")


@pytest.fixture(scope="module")
def units(tmp_path_factory) -> Path:
    return render_units(tmp_path_factory.mktemp("units") / "prefix")


@pytest.fixture(scope="module")
def keyed_units(tmp_path_factory) -> Path:
    return render_units(tmp_path_factory.mktemp("keyed") / "prefix", {"dsv4_router_api_key": KEY})


def unit_text(directory: Path, name: str) -> str:
    return (directory / name).read_text()


def verify(*paths: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(VERIFY), *map(str, paths)], capture_output=True, text=True,
                          timeout=180)
    return done.returncode, json.loads(done.stdout)


@needs_analyze
def test_the_rendered_units_verify_clean(units):
    code, result = verify(*(units / name for name in UNITS))
    assert code == 0 and result["problems"] == [], result


@needs_analyze
def test_a_misspelt_key_or_a_bad_value_fails_the_check(units, tmp_path):
    """systemd-analyze exits 0 on both; the check reads what it says."""
    text = unit_text(units, "dsv4-decode.service").replace("ProtectKernelTunables=true", "ProtectKernelTunable=true")
    text = text.replace("LockPersonality=true", "LockPersonality=maybe")
    broken = tmp_path / "dsv4-decode.service"
    broken.write_text(text)
    code, result = verify(broken)
    assert code == 1, result
    problems = "\n".join(result["problems"])
    assert "Unknown key 'ProtectKernelTunable'" in problems and "maybe" in problems


def exposure(directory: Path, name: str) -> float:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", name],
                          capture_output=True, text=True, timeout=120, cwd=directory)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout + done.stderr)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


@needs_analyze
def test_every_unit_stays_within_its_security_budget(units):
    assert set(SECURITY_BUDGET) == set(UNITS)
    scores = {name: exposure(units, name) for name in UNITS}
    over = {name: (score, SECURITY_BUDGET[name]) for name, score in scores.items() if score > SECURITY_BUDGET[name]}
    assert not over, f"systemd-analyze security got worse (score, budget): {over}"
    servers = role_defaults()["sglang_service_gpu_unit_names"]
    assert all(scores["dsv4-router.service"] < scores[name] for name in servers), scores


def test_the_router_has_no_gpu_exceptions_and_the_servers_load_no_module(units):
    router = unit_text(units, "dsv4-router.service")
    for line in ("PrivateDevices=true", "MemoryDenyWriteExecute=true", "ProtectSystem=strict",
                 "SystemCallFilter=@system-service"):
        assert line in router, line
    uvm = role_defaults()["sglang_service_uvm_unit"]
    for name in role_defaults()["sglang_service_gpu_unit_names"]:
        server = unit_text(units, name)
        assert "PrivateDevices" not in server and "MemoryDenyWriteExecute" not in server  # CUDA and the JITs
        assert "NoNewPrivileges=true" in server and "ProtectKernelModules=true" in server
        # ... so the module is loaded before them, as root, by the oneshot unit.
        assert re.search(rf"^After=.*{re.escape(uvm)}", server, re.M) and re.search(rf"^Wants=.*{re.escape(uvm)}", server, re.M)
        assert "IPAddressDeny=any" in server and "IPAddressAllow=localhost" in server
    loader = unit_text(units, uvm)
    assert "Type=oneshot" in loader and "RemainAfterExit=yes" in loader and "WantedBy=multi-user.target" in loader
    assert all(name in re.search(r"^Before=(.*)$", loader, re.M).group(1)
               for name in role_defaults()["sglang_service_gpu_unit_names"])


def test_the_loader_loads_the_module_and_makes_the_device_nodes(tmp_path):
    """files/nvidia_uvm.sh with a modprobe and an nvidia-modprobe stand-in: both are called, in order."""
    log = tmp_path / "calls"
    for tool in ("modprobe", "nvidia-modprobe"):
        (tmp_path / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        (tmp_path / tool).chmod(0o755)
    done = subprocess.run(["sh", str(ROLE / "files/nvidia_uvm.sh")], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["modprobe nvidia_uvm", "nvidia-modprobe -u -c=0"]
    (tmp_path / "modprobe").write_text("#!/bin/sh\necho \"modprobe: FATAL: Module nvidia_uvm not found\" >&2\nexit 1\n")
    done = subprocess.run(["sh", str(ROLE / "files/nvidia_uvm.sh")], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 1 and "nvidia_uvm not found" in done.stderr


def test_no_socket_binds_every_address_by_default(units):
    env = (units.parents[1] / "dsv4kit/service.env").read_text()
    assert "MC_TCP_BIND_ADDRESS=127.0.0.1" in env
    assert "NCCL_SOCKET_IFNAME=lo" in env and "GLOO_SOCKET_IFNAME=lo" in env and "SGLANG_HOST_IP=127.0.0.1" in env
    router = unit_text(units, "dsv4-router.service")
    assert "--host 127.0.0.1" in router and "--prometheus-host 127.0.0.1" in router


def test_with_a_router_key_the_servers_take_it_from_a_file_and_no_argv_holds_it(keyed_units):
    for name in UNITS:
        assert KEY not in unit_text(keyed_units, name), name
    secret = keyed_units.parents[1] / "dsv4kit/server-secret.yaml"
    assert secret.read_text().splitlines()[-1] == f'api-key: "{KEY}"'
    for name in role_defaults()["sglang_service_gpu_unit_names"]:
        assert re.search(rf"^ExecStart=.* --config {re.escape(str(secret))}$", unit_text(keyed_units, name), re.M)
    router = unit_text(keyed_units, "dsv4-router.service")
    assert "--api-key" not in router and "router-secret.env" in router and "dsv4-router-launch" in router


def test_the_router_launcher_gives_the_key_to_sglang_routers_own_parser(keyed_units, monkeypatch):
    """The router's ExecStart, parsed by sglang-router 0.3.2's parser through the launcher: the key
    arrives from the environment, the rest of the command line means what the unit says."""
    launch = pytest.importorskip("sglang_router.launch_router")
    import runpy
    import shlex

    exec_start = re.search(r"^ExecStart=(.*)$", unit_text(keyed_units, "dsv4-router.service"), re.M).group(1)
    argv = shlex.split(exec_start)
    assert argv[1].endswith("/dsv4-router-launch")
    started = []
    monkeypatch.setattr(launch, "launch_router", started.append)
    monkeypatch.setenv("DSV4_ROUTER_API_KEY", KEY)
    monkeypatch.setattr(sys, "argv", [str(ROLE / "files/router_launch.py"), *argv[2:]])
    runpy.run_path(str(ROLE / "files/router_launch.py"), run_name="__main__")
    (args,) = started
    assert args.api_key == KEY and args.pd_disaggregation and args.host == "127.0.0.1"
    assert args.decode_urls == ["http://127.0.0.1:30002"] and args.prefill_urls == [("http://127.0.0.1:30001", 8998)]
    monkeypatch.setattr(sys, "argv", ["x", *argv[2:], "--api-key", "inline"])
    with pytest.raises(SystemExit, match="not from --api-key"):
        runpy.run_path(str(ROLE / "files/router_launch.py"), run_name="__main__")


def _ruleset(directory: Path) -> Path:
    return directory.parents[1] / "nftables.d/dsv4kit.nft"


def test_the_optional_firewall_lets_in_ssh_and_only_an_open_routers_port(units, keyed_units, tmp_path_factory):
    """Off by default (the role includes it only with sglang_service_firewall: true); its ruleset
    drops every inbound connection but loopback, replies, ICMP, SSH, and the router when open."""
    assert role_defaults()["sglang_service_firewall"] is False
    closed = _ruleset(units).read_text()
    assert "policy drop;" in closed and 'iif "lo" accept' in closed
    assert re.findall(r"tcp dport (\d+) accept", closed) == ["22"]
    opened = render_units(tmp_path_factory.mktemp("open") / "prefix",
                          {"dsv4_router_open": True, "dsv4_router_api_key": KEY, "ansible_port": 2222})
    assert re.findall(r"tcp dport (\d+) accept", _ruleset(opened).read_text()) == ["2222", "30000"]
    if shutil.which("nft"):
        done = subprocess.run(["nft", "--check", "--file", str(_ruleset(opened))], capture_output=True, text=True,
                              timeout=60)
        if "Operation not permitted" not in done.stderr:  # nft needs CAP_NET_ADMIN even to check
            assert done.returncode == 0, done.stderr


#: /proc/devices on a box with the NVIDIA open modules loaded (major 195 is "nvidia-frontend" in
#: older drivers, "nvidia" in newer; uvm's and caps' majors are dynamic).
NVIDIA_DEVICE_GROUPS = ("nvidia-frontend", "nvidia", "nvidia-uvm", "nvidia-caps")


def device_allow(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)[1].split()) for line in text.splitlines() if line.startswith("DeviceAllow=")]


def test_gpu_units_keep_the_nvidia_devices_under_systemd_249s_protectclock(units):
    """The rule checked: systemd before 252 (Ubuntu 22.04 ships 249; systemd PR #25075) turns
    ProtectClock=true into DeviceAllow=char-rtc r, which closes the device list to the clock. So
    every GPU server with ProtectClock must allow each NVIDIA device group of /proc/devices itself
    (matched as systemd matches a char- group: fnmatch), read and write; and the unit that creates
    the NVIDIA device nodes (mknod, before nvidia-uvm's group exists) must not set ProtectClock."""
    import fnmatch

    for name in role_defaults()["sglang_service_gpu_unit_names"]:
        text = unit_text(units, name)
        assert "ProtectClock=true" in text  # kept: the rule is what makes it safe on 249
        allowed = device_allow(text)
        for group in NVIDIA_DEVICE_GROUPS:
            modes = [mode for spec, mode in allowed if spec.startswith("char-") and fnmatch.fnmatchcase(group, spec[5:])]
            assert any(set("rw") <= set(mode) for mode in modes), (name, group, allowed)
    loader = unit_text(units, role_defaults()["sglang_service_uvm_unit"])
    assert "ProtectClock" not in loader and not device_allow(loader)


@needs_analyze
def test_systemd_analyze_reads_the_closed_device_list_with_the_clock_and_the_gpus(units):
    """The real systemd-analyze reads the units' device list: closed, holding ProtectClock's
    char-rtc (the entry that, before 252, closed the list by itself) and the NVIDIA groups."""
    for name in role_defaults()["sglang_service_gpu_unit_names"]:
        done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", name],
                              capture_output=True, text=True, timeout=120, cwd=units)
        line = next(l for l in done.stdout.splitlines() if "DeviceAllow=" in l)
        assert "has a device ACL" in line and "char-rtc:r" in line and "char-nvidia*:rw" in line, line
