"""Real `dsv4kit provision` runs against the loopback sshd (this machine as a GPU-less box).

One module-scoped provisioning (every path under a scratch prefix, dsv4_gpu_present: false) is
shared by the first-run checks, the idempotence run and the context-length re-run; the playbook
and the package sources are snapshotted first so concurrent edits of the checkout cannot change
the wheel between runs. Needs root on the box side (apt's package list, file ownership), as CI has.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsv4kit.provision.playbook import run_playbook
from tests.provision_inventory import PLAYBOOK_SUPPORTED_OS, TINY_PACKAGES, write_loopback_inventory

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT_ITEMS = ["pyproject.toml", "README.md", "ansible.cfg", "playbooks", "toolkit", "kernels", "validation"]


def _snapshot(destination: Path) -> Path:
    for name in SNAPSHOT_ITEMS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif source.is_file():
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the loopback box is provisioned as root (apt package list, file ownership)")
    snapshot = _snapshot(tmp_path_factory.mktemp("checkout"))
    return dict(os.environ,
                DSV4KIT_PLAYBOOK=str(snapshot / "playbooks/site.yml"),
                ANSIBLE_CONFIG=str(snapshot / "ansible.cfg"),
                XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")),
                ANSIBLE_LOCAL_TEMP=str(tmp_path_factory.mktemp("ansible-tmp")))


def provision(inventory: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "-i", str(inventory), *args],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def box(loopback_ssh, env, tmp_path_factory):
    """The loopback box provisioned once: (inventory, prefix, first-run result)."""
    root = tmp_path_factory.mktemp("box")
    prefix = root / "prefix"
    inventory = write_loopback_inventory(root / "inventory", loopback_ssh, prefix)
    first = provision(inventory, env, "--json")
    return inventory, prefix, first


def run_in_process(inventory: Path, env: dict, lines: list, **kwargs):
    """run_playbook as `dsv4kit bench` calls it, with the snapshot's playbook and config."""
    old = dict(os.environ)
    os.environ.update({k: env[k] for k in ("DSV4KIT_PLAYBOOK", "ANSIBLE_CONFIG", "XDG_CACHE_HOME")})
    try:
        return run_playbook(inventory, progress=lines.append, **kwargs)
    finally:
        os.environ.clear()
        os.environ.update(old)


def _summary(result: subprocess.CompletedProcess) -> dict:
    assert result.stdout.strip(), result.stderr[-4000:]
    return json.loads(result.stdout)


def test_first_run_provisions_the_gpu_less_box(box):
    inventory, prefix, first = box
    summary = _summary(first)
    assert first.returncode == 0, first.stderr[-6000:]
    assert summary["ok"] and summary["hosts"]["loop"]["failed"] == 0 and summary["hosts"]["loop"]["changed"] > 0
    log = first.stderr
    # Progress streamed, GPU stages in check mode, the table at the end.
    assert "TASK [preflight : Report the box]" in log
    assert "GPU-less target: nvidia_driver runs in check mode" in log
    assert "HOST" in log and "provision: ok" in log

    venv = prefix / "opt/dsv4/venv"
    state = prefix / "var/lib/dsv4kit"
    freeze = (state / "sglang-venv.freeze.txt").read_text()
    assert TINY_PACKAGES[0] in freeze.splitlines()
    assert "torch" not in freeze
    # The dsv4kit wheel is in the venv and its rollout status was checked on the box.
    installed = subprocess.run([str(venv / "bin/python"), "-c",
                                "import importlib.metadata as m; print(m.version('dsv4kit'))"],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert installed
    # The marker lives in the venv: a recreated venv gets the wheel again.
    assert (venv / ".dsv4kit-wheel.installed").read_text().strip()
    assert "plugin installed in" in log
    # The restart the changes asked for was recorded, then carried out (no unit runs here) and forgotten.
    assert "RUNNING HANDLER [sglang_service : Forget the pending restart (done)]" in log
    assert not (state / "restart-pending").exists()
    flags = (prefix / "etc/dsv4kit/kernel-flags.env").read_text()
    assert "SGLANG_SM120_TRITON_INDEXER=1" in flags and "SGLANG_SM120_MMA_ATTENTION=1" in flags

    units = prefix / "etc/systemd/system"
    prefill = (units / "dsv4-prefill.service").read_text()
    decode = (units / "dsv4-decode.service").read_text()
    router = (units / "dsv4-router.service").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in prefill and "--disaggregation-mode prefill" in prefill
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in decode and "--cuda-graph-max-bs-decode 64" in decode
    assert "--context-length 131072" in decode and "--tp 4" in decode
    assert f"ExecStart={venv}/bin/python -m sglang.launch_server" in decode
    assert "ExecStartPre=" in decode and "Restart=on-failure" in decode
    assert f"/bin/python {prefix}/var/lib/dsv4kit/bin/dsv4-router-launch --pd-disaggregation" in router
    for unit in (prefill, decode, router):
        assert "User=root" in unit and f"EnvironmentFile={prefix}/etc/dsv4kit/service.env" in unit
    assert "units ok" in log and "not started" in log
    # The rendered ExecStartPre refuses a decode server without its model, with one clear line.
    preflight = state / "bin/dsv4-serve-preflight"
    refused = subprocess.run([str(preflight), "decode", "30002", "4"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "dsv4 preflight (decode): model directory /models/DeepSeek-V4-Flash does not exist"
    # Nothing under the prefix points outside it, except system binaries read by the units.
    assert (prefix / "etc/modprobe.d/dsv4-nvidia-uvm.conf").read_text().strip().endswith("options nvidia_uvm uvm_disable_hmm=1")


def test_second_run_changes_nothing(box, env):
    inventory, _, first = box
    assert first.returncode == 0, first.stderr[-4000:]
    second = provision(inventory, env, "--json")
    summary = _summary(second)
    assert second.returncode == 0, second.stderr[-6000:]
    assert summary["hosts"]["loop"]["changed"] == 0, second.stderr[-8000:]
    assert "provision: ok, 0 changed" in second.stderr


def test_recreated_venv_gets_the_dsv4kit_wheel_again(box, env):
    """The docs say to remove the venv when its Python is wrong: the next run must reinstall dsv4kit."""
    inventory, prefix, first = box
    assert first.returncode == 0
    venv = prefix / "opt/dsv4/venv"
    assert venv.is_symlink()  # to the versioned venv of the pins
    shutil.rmtree(venv.resolve())
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=["sglang_venv", "kernel_rollout"])
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    installed = subprocess.run([str(venv / "bin/python"), "-c",
                                "import importlib.metadata as m; print(m.version('dsv4kit'))"],
                               capture_output=True, text=True)
    assert installed.returncode == 0 and installed.stdout.strip(), installed.stderr
    assert (venv / ".dsv4kit-wheel.installed").is_file()


def _task_outcome(lines: list[str], task: str) -> str:
    """The first result line ("ok", "changed", "skipping", "fatal") after TASK [task]."""
    start = lines.index(next(line for line in lines if line.startswith(f"TASK [{task}]")))
    return next(line.split(":")[0] for line in lines[start + 1:] if line.split(":")[0] in ("ok", "changed", "skipping", "fatal"))


def test_marker_of_an_earlier_version_is_taken_over(box, env):
    """Earlier versions kept the dsv4kit marker in dsv4_state_dir: an upgraded box must not reinstall the
    wheel (and restart the servers) for it, unless the venv was created after that marker."""
    inventory, prefix, first = box
    assert first.returncode == 0
    venv = prefix / "opt/dsv4/venv"
    marker, old = venv / ".dsv4kit-wheel.installed", prefix / "var/lib/dsv4kit/dsv4kit.installed"
    flag = prefix / "var/lib/dsv4kit/restart-pending"
    sha = marker.read_text()
    old.write_text(sha)
    marker.unlink()
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=["kernel_rollout"])
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    assert _task_outcome(lines, "kernel_rollout : Install the wheel into the venv without dependencies") == "skipping"
    assert marker.read_text() == sha and not old.exists() and not flag.exists()
    assert not any(line.startswith("RUNNING HANDLER") for line in lines)
    # A venv newer than the old marker (recreated since): the wheel goes in again.
    old.write_text(sha)
    created = (venv / "pyvenv.cfg").stat().st_mtime
    os.utime(old, (created - 60, created - 60))
    marker.unlink()
    lines.clear()
    summary = run_in_process(inventory, env, lines, tags=["kernel_rollout"])
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    assert _task_outcome(lines, "kernel_rollout : Install the wheel into the venv without dependencies") == "changed"
    assert marker.read_text() == sha and not old.exists() and not flag.exists()


def _handled(lines: list[str]) -> bool:
    return any(line.startswith("RUNNING HANDLER [sglang_service : Forget the pending restart (done)]") for line in lines)


def test_an_unverified_rollout_blocks_every_restart_until_kernel_rollout_passes(box, env):
    """No force_handlers: a run that fails after a change never restarts the servers, the restart it
    asked for is kept in dsv4_state_dir/restart-pending. A rollout that failed its status check (or
    whose install stopped half-way) is also marked unverified, and no run without kernel_rollout
    (bench's context-length restart, --tags host_tuning) restarts the units onto it: it fails naming
    the stage to run, which checks the rollout again and then carries out the restart."""
    inventory, prefix, first = box
    assert first.returncode == 0
    venv = prefix / "opt/dsv4/venv"
    state = prefix / "var/lib/dsv4kit"
    flag, unverified = state / "restart-pending", state / "rollout-unverified"
    decode = prefix / "etc/systemd/system/dsv4-decode.service"
    nccl_file = prefix / "etc/dsv4kit/nccl.env"
    (venv / ".dsv4kit-wheel.installed").unlink()  # the wheel is installed again
    nccl = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())["dsv4_nccl_env"]
    misspelt = {"SGLANG_SM120_TRITON_INDEXER": "1", "SGLANG_SM120_MMA_ATTENTON": "1"}
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=["host_tuning", "kernel_rollout"],
                             extra_vars={"dsv4_nccl_env": {**nccl, "NCCL_DEBUG": "WARN"}, "dsv4_kernel_flags": misspelt})
    assert summary.exit_code == 6
    assert _task_outcome(lines, "kernel_rollout : Install the wheel into the venv without dependencies") == "changed"
    assert not any(line.startswith("RUNNING HANDLER") for line in lines)  # nothing restarted
    assert flag.is_file() and unverified.is_file()
    assert "dsv4kit provision --tags kernel_rollout" in unverified.read_text()
    assert not (venv / ".dsv4kit-wheel.installed").exists()  # the failed rollout is retried
    assert "NCCL_DEBUG=WARN" in nccl_file.read_text()

    # What `dsv4kit bench --ctx N` runs: sglang_service alone refuses before it changes anything.
    unit = decode.read_text()
    refusal = "sglang_service : Refuse to start or restart the serving units onto an unverified dsv4kit rollout"
    lines.clear()
    summary = run_in_process(inventory, env, lines, tags=["sglang_service"], extra_vars={"dsv4_context_length": 8192})
    assert summary.exit_code == 6
    assert [f.task for f in summary.failures] == [refusal]
    log = "\n".join(lines)
    assert f"{unverified} exists" in log and "`dsv4kit provision --tags kernel_rollout,sglang_service`" in log
    assert decode.read_text() == unit and summary.hosts["loop"]["changed"] == 0
    assert flag.is_file() and unverified.is_file() and not _handled(lines)

    # Another stage alone whose change notifies the restart: the handler refuses as well.
    lines.clear()
    summary = run_in_process(inventory, env, lines, tags=["host_tuning"],
                             extra_vars={"dsv4_nccl_env": {**nccl, "NCCL_DEBUG": "INFO"}})
    assert summary.exit_code == 6
    assert [f.task for f in summary.failures] == ["sglang_service : Refuse to restart the serving units onto an unverified dsv4kit rollout"]
    assert not any("Restart the running serving units" in line for line in lines)
    assert flag.is_file() and unverified.is_file() and "NCCL_DEBUG=INFO" in nccl_file.read_text()

    # --check: without kernel_rollout it predicts the refusal; with it, the check that clears the file.
    for tags, exit_code in ((["sglang_service"], 6), (["kernel_rollout", "sglang_service"], 0)):
        lines.clear()
        summary = run_in_process(inventory, env, lines, tags=tags, check=True)
        assert summary.exit_code == exit_code, "\n".join(lines[-80:])
        assert flag.is_file() and unverified.is_file()  # --check changes nothing

    # The two stages with the inventory's settings (no units here): the rollout is checked, the file
    # removed, the restart runs at the end of the play and is forgotten; a second run changes nothing.
    for expect_changes in (True, False):
        lines.clear()
        summary = run_in_process(inventory, env, lines, tags=["host_tuning", "kernel_rollout"])
        assert summary.exit_code == 0, "\n".join(lines[-80:])
        assert _handled(lines) == expect_changes and (summary.hosts["loop"]["changed"] > 0) == expect_changes, "\n".join(lines[-80:])
        assert not flag.exists() and not unverified.exists() and (venv / ".dsv4kit-wheel.installed").is_file()
    assert "NCCL_DEBUG" not in nccl_file.read_text()


def test_a_template_failing_after_a_change_still_records_the_restart(box, env):
    """The unit files are written in a block whose always: records the restart: a later template that
    fails (here the router unit, after the decode unit changed) does not lose it, and the next
    successful run of the serving stage carries it out with nothing else to change."""
    inventory, prefix, first = box
    assert first.returncode == 0
    flag = prefix / "var/lib/dsv4kit/restart-pending"
    decode = prefix / "etc/systemd/system/dsv4-decode.service"
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=["sglang_service"],
                             extra_vars={"dsv4_context_length": 4096,
                                         "sglang_service_router_host": "{{ not_defined_anywhere_in_this_test }}"})
    assert summary.exit_code == 6
    assert [f.task for f in summary.failures] == ["sglang_service : Write the router unit"]
    assert "--context-length 4096" in decode.read_text()
    assert _task_outcome(lines, "sglang_service : Record that the serving units need a restart") == "changed"
    assert not any(line.startswith("RUNNING HANDLER") for line in lines) and flag.is_file()

    # The same settings without the broken one: nothing left to render, the recorded restart is done.
    lines.clear()
    summary = run_in_process(inventory, env, lines, tags=["sglang_service"], extra_vars={"dsv4_context_length": 4096})
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    assert _task_outcome(lines, "sglang_service : Write the prefill and decode units") == "ok"
    assert _task_outcome(lines, "sglang_service : Carry out the pending restart (from this run or an earlier one that did not finish)") == "changed"
    assert _handled(lines) and not flag.exists()

    lines.clear()
    summary = run_in_process(inventory, env, lines, tags=["sglang_service"])
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    assert "--context-length 131072" in decode.read_text() and _handled(lines) and not flag.exists()


def test_serving_tag_rerenders_units_with_another_context_length(box, env):
    """What `dsv4kit bench --ctx N` does: the sglang_service stage alone, with an extra var."""
    inventory, prefix, first = box
    assert first.returncode == 0
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=["sglang_service"], extra_vars={"dsv4_context_length": 8192})
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    assert summary.hosts["loop"]["changed"] >= 1
    assert not any("kernel_rollout :" in line for line in lines)  # only the tagged stage ran
    assert "--context-length 8192" in (prefix / "etc/systemd/system/dsv4-decode.service").read_text()


def test_rollout_check_catches_a_misspelt_kernel_flag(box, env):
    """Turning one kernel off and misspelling the other: the flags file follows the inventory and
    the on-box `dsv4kit.rollout status` check names the flag it does not know."""
    inventory, prefix, first = box
    assert first.returncode == 0
    lines: list[str] = []
    flags = {"SGLANG_SM120_TRITON_INDEXER": "0", "SGLANG_SM120_MMA_ATTENTON": "1"}
    summary = run_in_process(inventory, env, lines, tags=["kernel_rollout"], extra_vars={"dsv4_kernel_flags": flags})
    assert summary.exit_code == 6
    assert [f.task for f in summary.failures] == ["kernel_rollout : Check the plugin is installed and the flags are read as written"]
    log = "\n".join(lines)
    assert "flags read differently: ['SGLANG_SM120_MMA_ATTENTON=1']" in log
    written = (prefix / "etc/dsv4kit/kernel-flags.env").read_text()
    assert "SGLANG_SM120_TRITON_INDEXER=0" in written


def _six_version(venv: Path) -> str:
    return subprocess.run([str(venv / "bin/python"), "-c", "import six; print(six.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_pin_change_builds_a_new_venv_and_the_old_one_stays_for_rollback(box, env):
    """A new pin never upgrades the venv under the running servers: a new versioned venv is built
    (packages, dsv4kit wheel, its status check), the symlink dsv4_venv_dir switches in sglang_service
    and the restart follows. Rollback is the old pins and one run: nothing is installed again."""
    inventory, prefix, first = box
    assert first.returncode == 0
    venv = prefix / "opt/dsv4/venv"
    old = venv.resolve()
    assert venv.is_symlink() and _six_version(venv) == "1.17.0"
    stages = ["sglang_venv", "kernel_rollout", "sglang_service"]
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=stages, extra_vars={"dsv4_venv_packages": ["six==1.16.0"]})
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    new = venv.resolve()
    assert new != old and _six_version(venv) == "1.16.0"
    assert _six_version(old) == "1.17.0"  # untouched, for rollback
    assert (new / ".dsv4kit-wheel.installed").is_file() and _handled(lines)
    switch = lines.index(next(l for l in lines if l.startswith("TASK [sglang_service : Switch the venv")))
    rollout = lines.index(next(l for l in lines if l.startswith("TASK [kernel_rollout : Check the rollout status")))
    assert rollout < switch  # the switch comes once the new venv is complete

    lines.clear()
    summary = run_in_process(inventory, env, lines, tags=stages)
    assert summary.exit_code == 0, "\n".join(lines[-80:])
    assert venv.resolve() == old and _six_version(venv) == "1.17.0" and _handled(lines)
    assert _task_outcome(lines, "sglang_venv : Install the pinned packages") == "ok"
    assert _task_outcome(lines, "kernel_rollout : Install the wheel into the venv without dependencies") == "skipping"


def test_check_mode_on_a_new_box_changes_nothing(loopback_ssh, env, tmp_path):
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix")
    result = provision(inventory, env, "--check", "--json")
    assert result.returncode == 0, result.stderr[-6000:]
    assert json.loads(result.stdout)["hosts"]["loop"]["changed"] > 0  # it predicts the changes
    assert not (tmp_path / "prefix").exists()  # and makes none


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_host_gives_summary_and_exit_3(loopback_ssh, env, tmp_path):
    port = _closed_port()
    # The key is known for the closed port too: dsv4kit's own known_hosts check lets the run through.
    known = tmp_path / "known_hosts"
    known.write_text(loopback_ssh.host_key_line().replace(f":{loopback_ssh.port} ", f":{port} "))
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix", host="downbox",
                                         overrides={"dsv4_known_hosts": str(known)})
    text = inventory.read_text().replace(f"ansible_port: {loopback_ssh.port}", f"ansible_port: {port}")
    inventory.write_text(text.replace(str(loopback_ssh.known_hosts), str(known)))
    result = provision(inventory, env)
    assert result.returncode == 3, result.stdout[-3000:]
    assert "UNREACHABLE!" in result.stdout  # Ansible's own error text is shown
    assert "Connection refused" in result.stdout
    assert "downbox: unreachable at task [Gathering Facts]" in result.stdout
    assert "provision: unreachable host(s)" in result.stdout


def test_failing_task_gives_summary_and_exit_6(loopback_ssh, env, tmp_path):
    # A box that claims 8 GPUs, with the playbook's own list of operating systems: this Debian 12
    # machine is refused (no python3.12, no deadsnakes), and with the OS let through, preflight's
    # GPU count check fails.
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix",
                                         overrides={"dsv4_gpu_present": True},
                                         role_vars={"preflight_supported_os": PLAYBOOK_SUPPORTED_OS})
    result = provision(inventory, env, "--tags", "preflight", "--json")
    assert result.returncode == 6, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["hosts"]["loop"]["failed"] == 1
    assert summary["failures"] == [{"host": "loop", "task": "preflight : Fail clearly on an unsupported operating system",
                                    "kind": "FAILED"}]
    assert "Debian 12 is not supported; dsv4kit provisions Ubuntu 22.04, Ubuntu 24.04" in result.stderr
    lines: list[str] = []
    summary = run_in_process(inventory, env, lines, tags=["preflight"],
                             extra_vars={"preflight_supported_os": ["Debian 12"]})
    assert summary.exit_code == 6
    assert [(f.host, f.task, f.kind) for f in summary.failures] == [("loop", "preflight : Check the GPU count", "FAILED")]
    assert "expected dsv4_gpu_count=8" in "\n".join(lines)  # the assert's own message, not hidden
    assert not (tmp_path / "prefix").exists()  # preflight changes nothing


def test_bad_inventory_is_exit_2_before_ansible_runs(env, tmp_path):
    broken = tmp_path / "hosts.yml"
    broken.write_text("all:\n  children:\n    dsv4_boxes:\n      hosts:\n        box1:\n          dsv4_contxt_length: 1\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/all.yml").write_text((REPO / "inventory/group_vars/all.yml").read_text())
    result = provision(broken, env)
    assert result.returncode == 2
    assert "dsv4_contxt_length" in result.stderr and "dsv4_context_length" in result.stderr
    assert "PLAY" not in result.stdout
    result = provision(REPO / "inventory/fleet.yml", env, "--limit", "box9")
    assert result.returncode == 2 and "box9" in result.stderr


def test_one_box_down_with_a_report_on_file_leaves_the_others_provisioned(loopback_ssh, env, tmp_path, monkeypatch):
    """'auto' needs the down box's GPU and driver (its report is on file): that box is left out and
    reported, the reachable one is provisioned (--check here), and the run exits 3 naming --limit."""
    from tests.rollout.test_kernel_plan import keep, validated_report

    port = _closed_port()
    known = tmp_path / "known_hosts"
    known.write_text(loopback_ssh.host_key_line()
                     + loopback_ssh.host_key_line().replace(f":{loopback_ssh.port} ", f":{port} "))
    results = tmp_path / "results"
    keep(results, validated_report(tmp_path, monkeypatch), host="downbox")
    down = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": loopback_ssh.user,
            "ansible_ssh_private_key_file": str(loopback_ssh.client_key), "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_become": False, "dsv4_fp4_indexer": "auto"}
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix",
                                         overrides={"dsv4_known_hosts": str(known)}, extra_hosts={"downbox": down})
    inventory.write_text(inventory.read_text().replace(str(loopback_ssh.known_hosts), str(known)))
    result = provision(inventory, env, "--check", "--tags", "preflight,sglang_service", "--results-dir", str(results))
    out = result.stdout + result.stderr
    assert result.returncode == 3, out[-6000:]
    assert "downbox: unreachable, left out of this run: cannot read downbox's GPU" in out, out[-4000:]
    assert "provisioning loop without downbox" in out
    assert "provision: unreachable host(s) downbox (any other hosts ran)" in out
    assert "`dsv4kit provision --limit downbox`" in out
    recap = [line.split() for line in result.stdout.splitlines() if line.startswith(("loop ", "downbox "))]
    rows = {row[0]: row for row in recap if len(row) == 6}
    # The play ran on loop (on this bare box sglang_service's --check then stops at the venv that has
    # no verified rollout yet, its own matter); downbox is counted unreachable.
    assert int(rows["loop"][1]) > 5 and rows["loop"][4] == "0", out[-3000:]
    assert rows["downbox"][4] == "1"


def test_a_changed_host_key_is_said_with_the_line_that_removes_it(loopback_ssh, env, tmp_path):
    """known_hosts holds another key for the box (it was reinstalled): not "unreachable" alone."""
    from tests.remote_inventory import keygen

    other = keygen(tmp_path / "other_host_key").with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{loopback_ssh.port} {other[0]} {other[1]}\n")
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix",
                                         overrides={"dsv4_known_hosts": str(known)})
    inventory.write_text(inventory.read_text().replace(str(loopback_ssh.known_hosts), str(known)))
    # A fresh ControlPath directory: a master connection of an earlier run would skip the key check.
    result = provision(inventory, {**env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp")}, "--tags", "preflight")
    assert result.returncode == 3, result.stdout[-3000:]
    assert "loop: its HOST KEY CHANGED (the box answers" in result.stdout, result.stdout[-3000:]
    assert f"ssh-keygen -R '[127.0.0.1]:{loopback_ssh.port}' -f {known}" in result.stdout


def test_a_login_named_only_by_the_ssh_config_owns_the_scratch_directory(env, tmp_path):
    """No ansible_user: ssh takes the login from its config (here -F, as ~/.ssh/config would). The
    scratch directory `validate` writes into as that login is owned by it, not by root."""
    import pwd

    from tests.sudo_login import sudo_login

    with sudo_login() as login:
        config = tmp_path / "ssh_config"
        config.write_text(f"Host 127.0.0.1\n  User {login.user}\n")
        host = {k: v for k, v in login.host_vars().items() if k != "ansible_user"}
        host["ansible_ssh_common_args"] = f"-F {config} " + host["ansible_ssh_common_args"]
        prefix = tmp_path / "prefix"
        inventory = write_loopback_inventory(tmp_path / "inv", login.sshd, prefix)
        hosts = yaml.safe_load(inventory.read_text())
        hosts["all"]["children"]["dsv4_boxes"]["hosts"]["loop"] = host
        inventory.write_text(yaml.safe_dump(hosts))
        result = provision(inventory, env, "--tags", "sglang_venv")
        assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
        scratch = prefix / "var/lib/dsv4kit/scratch"
        assert pwd.getpwuid(scratch.stat().st_uid).pw_name == login.user


def test_provision_serial_provisions_one_box_after_the_other(loopback_ssh, env, tmp_path):
    """-e provision_serial=1: each box goes through the whole play (a restart and its health wait) before
    the next one starts: a rolling restart across boxes."""
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix")
    hosts = yaml.safe_load(inventory.read_text())
    boxes = hosts["all"]["children"]["dsv4_boxes"]["hosts"]
    boxes["loop2"] = dict(boxes["loop"])
    inventory.write_text(yaml.safe_dump(hosts))
    result = provision(inventory, env, "--tags", "preflight", "-e", "provision_serial=1")
    assert result.returncode == 0, result.stdout[-4000:]
    import re

    batches = result.stdout.split("TASK [Gathering Facts]")[1:]
    assert len(batches) == 2, result.stdout[-4000:]  # one batch per box, one after the other
    assert [set(re.findall(r"^ok: \[(loop2?)\]", batch, re.M)) for batch in batches] == [{"loop"}, {"loop2"}]
