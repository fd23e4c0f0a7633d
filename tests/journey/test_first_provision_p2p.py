"""The first provision of a fresh box runs the P2P check (issue 37, item 4).

host_tuning runs before the SGLang venv exists, so the check waits for kernel_rollout's end, when
the venv of these pins has torch and dsv4kit. The venv's symlink (dsv4_venv_dir) comes later still,
with sglang_service: a check that looks for the venv through it is skipped on every first provision.

This runs the stages that matter in the playbook's own order with the real ``dsv4kit provision``
(the real ansible-playbook over the loopback sshd) on a fresh simulated box
(tests/journey/quickstart_box.py), whose venv python logs each run of the P2P check. The check
itself runs for real and, with no CUDA on this machine, says so and exits 7, which the stage
accepts; the test fails when it never ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.journey.quickstart_box import QuickstartBox, p2p_log
from tests.journey.test_quickstart_journey import user_inventory

pytestmark = pytest.mark.slow

STAGES = "host_tuning,sglang_venv,kernel_rollout"


@pytest.fixture
def box(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the box is provisioned as root (file ownership)")
    box = QuickstartBox(tmp_path_factory.mktemp("p2p"))  # a short path: ssh's control socket lives under it
    yield box
    box.stop()


def test_a_fresh_boxs_first_provision_runs_the_p2p_check(box):
    inventory = user_inventory(box)
    env = {"HOME": str(box.home), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "LANG": "C.UTF-8", "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    venv_link = box.prefix / "opt/dsv4/venv"
    assert not venv_link.exists()  # fresh: neither the venv nor its symlink
    done = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "--inventory", str(inventory),
                           "--tags", STAGES], cwd=box.home, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert not venv_link.exists(), "sglang_service ran: this test is about the stages before it"
    log = p2p_log(box.tools)
    runs = log.read_text().splitlines() if log.exists() else []
    assert len(runs) == 1, f"the P2P check ran {len(runs)} times (expected once, at kernel_rollout's end):\n" \
                           + output[-6000:]
    assert runs[0].startswith("-m dsv4kit.validation.p2p --groups 0,1,2,3 4,5,6,7 --json "), runs
    assert "P2P check skipped" not in output, output[-6000:]
