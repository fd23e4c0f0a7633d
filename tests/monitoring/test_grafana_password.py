"""Grafana's admin password stays out of `ps`, sudo's log and -vvv output while the monitoring role
writes it.

The role's own task file (tasks/grafana_password.yml, what config.yml imports) runs through the
real ansible-playbook -vvv over a real sshd, logged in as a non-root user who becomes root with sudo
(tests/sudo_login.py), as tests/journey/test_serving_box.py does for the router's key. While it
runs, a watch reads every process's argv and every non-root process's environment; then sudo's log
and the -vvv output are searched. Only that task runs: the rest of the role does not touch the
password.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.monitoring.support import REPO, ROLE

PASSWORD = "grafana-Adm1n-never-in-ps-7c41"


def test_the_password_reaches_its_file_only(tmp_path):
    from tests.sudo_login import ProcessWatch, sudo_login

    if os.geteuid() != 0:
        pytest.skip("needs root to add a login user with sudo")
    # Outside pytest's 0700 tree, as the box has it: root writes there after sudo.
    prefix = Path(tempfile.mkdtemp(prefix="dsv4kit-grafana-"))
    grafana_dir = prefix / "etc/grafana"
    grafana_dir.mkdir(parents=True)
    (tmp_path / "extra.json").write_text(json.dumps({"dsv4_grafana_admin_password": PASSWORD,
                                                     "monitoring_grafana_dir": str(grafana_dir)}))
    play = [{"hosts": "box", "gather_facts": False,
             "tasks": [{"name": "The role's password task",
                        "ansible.builtin.include_tasks": str(ROLE / "tasks/grafana_password.yml")}],
             "handlers": [{"name": "Restart Grafana", "ansible.builtin.debug": {"msg": "Grafana would restart"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    try:
        with sudo_login() as login:
            (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": login.host_vars()}}}))
            watch = ProcessWatch(PASSWORD, marker="AnsiballZ_copy", interval=0.005)
            with watch.running():
                run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-vvv",
                                      "-i", str(tmp_path / "hosts.yml"), "-e", f"@{tmp_path / 'extra.json'}",
                                      str(tmp_path / "play.yml")], capture_output=True, text=True, timeout=300,
                                     env=env)
            sudo_log = login.sudo_log.read_text() if login.sudo_log.exists() else ""
        secret = grafana_dir / "admin_password"
        written = secret.read_text() if secret.exists() else None
        mode = secret.stat().st_mode & 0o777 if secret.exists() else None
    finally:
        subprocess.run(["rm", "-rf", str(prefix)], timeout=60)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert written == PASSWORD and mode == 0o640, (written, oct(mode or 0))
    assert "<127.0.0.1> SSH: EXEC" in run.stdout and "Grafana would restart" in run.stdout  # -vvv, and it ran
    assert f"{login.user} :" in sudo_log and "COMMAND=" in sudo_log, sudo_log[-2000:]
    assert not watch.found, sorted(watch.found)
    assert PASSWORD not in sudo_log, "the password is in sudo's log"
    assert PASSWORD not in run.stdout + run.stderr, "the password is in the -vvv output"
