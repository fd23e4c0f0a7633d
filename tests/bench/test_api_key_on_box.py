"""The router's API key is read on the box, from the root-only file the provision role writes, by
the processes that send it: never on a command line, never in an environment another process of
the login user can read, never in sudo's log.

As the box has it: a non-root login with real sudo over a real sshd (tests/sudo_login.py), the key
file root-owned and 0600 under the inventory's prefix, a stand-in server that refuses every request
without the key (SGLang 0.5.23's own auth rule), and the real ``sglang.benchmark.serving`` client.
While the bench runs, a watch reads every process's argv and every non-root process's environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dsv4kit.core.box_paths import ROUTER_KEY_FILE
from dsv4kit.serving.session import key_file

KEY = "sk-box-only-5d0c-never-in-ps"


def test_the_key_file_is_where_the_role_writes_it():
    """The control side names the file the role writes (``sglang_service_router_secret_file``)."""
    import yaml

    from tests.service_units import ROLE

    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    site_vars = yaml.safe_load((ROLE.parents[2] / "playbooks/site.yml").read_text())[0]["vars"]
    assert defaults["sglang_service_router_secret_file"] == "{{ dsv4_etc_dir }}/router-secret.env"
    assert site_vars["dsv4_etc_dir"] == "{{ dsv4_root }}/etc/dsv4kit" and ROUTER_KEY_FILE == "/etc/dsv4kit/router-secret.env"
    assert key_file({"dsv4_prefix": "/srv/box/"}) == "/srv/box/etc/dsv4kit/router-secret.env"
    assert key_file({}) == "/etc/dsv4kit/router-secret.env"


@pytest.mark.slow
def test_a_bench_as_a_sudo_login_reads_the_key_on_the_box_and_never_shows_it(tmp_path, bench_venv, tokenizer_dir,
                                                                              monkeypatch):
    from tests.bench_support import FakeServer, bench_inventory, in_process_sweep
    from tests.sudo_login import ProcessWatch, reachable_by, sudo_login

    if os.geteuid() != 0:
        pytest.skip("needs root to add a login user with sudo")
    monkeypatch.setenv("DSV4KIT_SPILL_DIR", str(tmp_path / "spill"))
    # Outside pytest's 0700 tree, as the box has it: /etc/dsv4kit root's, the key file 0600.
    prefix = Path(tempfile.mkdtemp(prefix="dsv4kit-key-"))
    server = None
    try:
        prefix.chmod(0o755)
        secret = prefix / ROUTER_KEY_FILE.lstrip("/")
        secret.parent.mkdir(parents=True, mode=0o755)
        secret.write_text(f"DSV4_ROUTER_API_KEY={KEY}\n")
        secret.chmod(0o600)
        model = prefix / "model"
        shutil.copytree(tokenizer_dir, model)
        for path in (model, *model.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        server = FakeServer(tmp_path / "server", model, api_key_file=str(secret)).start()
        with pytest.raises(urllib.error.HTTPError) as refused:  # the stand-in indeed wants the key
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/server_info", timeout=10)
        assert refused.value.code == 401
        with sudo_login() as login, reachable_by(bench_venv, os.path.realpath(bench_venv / "bin" / "python")):
            inventory = bench_inventory(tmp_path / "inv", login.sshd, venv=bench_venv, model_path=model,
                                        port=server.port, context_length=4096, prefix=prefix,
                                        ansible_user=login.user,
                                        ansible_ssh_private_key_file=str(login.sshd.client_key))
            watch = ProcessWatch(KEY, marker="sglang.benchmark.serving")
            with watch.running():
                record, _ = in_process_sweep(inventory, concurrency=[2], repeat=1, num_prompts=4, warmup_requests=1,
                                             output_len=16)
            # The watch sees a login process's environment: one started with the key in it is found.
            planted = subprocess.Popen(["sleep", "30"], env={"OPENAI_API_KEY": KEY}, user=login.user)
            try:
                control = ProcessWatch(KEY)
                control.scan()
            finally:
                planted.kill()
                planted.wait()
            sudo_log = login.sudo_log.read_text() if login.sudo_log.exists() else ""
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(prefix, ignore_errors=True)
    point = record["points"][0]
    gates = point["validity"]["gates"]
    assert gates["completed"]["passed"] and gates["no_errors"]["passed"], gates  # every request carried the key
    assert not watch.found, sorted(watch.found)
    assert any(" -m dsv4box.key sglang.benchmark.serving" in line for line in watch.seen), sorted(watch.seen)
    assert any(f"environment of pid {planted.pid}" in found for found in control.found), control.found
    lines = " ".join(sudo_log.split())  # sudo wraps its log lines
    assert f"{login.user} :" in lines and f"COMMAND=/usr/bin/cat -- {secret}" in lines, sudo_log[-2000:]
    assert KEY not in sudo_log, "the key is in sudo's log"
