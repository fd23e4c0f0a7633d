"""The model_weights stage against a loopback stand-in for the Hugging Face Hub (tests/fake_hf_hub.py).

fetch_model.py runs as the role runs it (the venv's Python, HF_ENDPOINT and HF_TOKEN in the
environment); then the role itself, through the loopback sshd: a download, a second run that changes
nothing, a directory that does not match, a branch name refused, the token never in the log.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
from tests.fake_hf_hub import FakeHub  # noqa: E402
from tests.provision_inventory import write_loopback_inventory  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "playbooks/roles/model_weights/files/fetch_model.py"
MODEL = "deepseek-ai/DeepSeek-V4-Flash"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_s3cretTokenValue"
FILES = {"config.json": b'{"model_type": "deepseek_v4"}\n',
         "model-00001-of-00002.safetensors": os.urandom(4096),
         "model-00002-of-00002.safetensors": os.urandom(2048),
         "inference/README.md": b"# inference\n"}


@pytest.fixture
def hub():
    server = FakeHub(MODEL, dict(FILES), commit=COMMIT, token=TOKEN).start()
    yield server
    server.stop()


def fetch(hub, dest: Path, revision: str = COMMIT, *flags: str, token: str = TOKEN) -> tuple[int, dict]:
    env = dict(os.environ, HF_ENDPOINT=hub.endpoint, HF_TOKEN=token, HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_HOME=str(dest.parent / "hf-home"))
    proc = subprocess.run([sys.executable, str(SCRIPT), MODEL, revision, str(dest), getpass.getuser(), *flags],
                          capture_output=True, text=True, env=env, timeout=300)
    assert TOKEN not in proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_download_verify_and_a_second_run_that_changes_nothing(hub, tmp_path):
    dest = tmp_path / "model"
    rc, out = fetch(hub, dest, COMMIT, "--check")
    assert rc == 0 and out["changed"] and not dest.exists()  # --check changes nothing
    rc, out = fetch(hub, dest)
    assert rc == 0 and out["changed"], out
    for name, data in FILES.items():
        assert (dest / name).read_bytes() == data
    manifest = json.loads((dest / ".dsv4kit-model.json").read_text())
    assert manifest["commit"] == COMMIT and set(manifest["files"]) == set(FILES)
    hub.requests.clear()
    rc, out = fetch(hub, dest)
    assert rc == 0 and not out["changed"], out
    assert not any("/resolve/" in r for r in hub.requests)  # nothing downloaded again


def test_a_directory_that_does_not_match_is_refused_untouched(hub, tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "model-00001-of-00002.safetensors").write_bytes(os.urandom(4096))  # same size, other content
    rc, out = fetch(hub, dest)
    assert rc == 1 and out["wrong"] == ["model-00001-of-00002.safetensors"], out
    assert "nothing was changed" in out["message"]
    assert sorted(p.name for p in dest.iterdir()) == ["model-00001-of-00002.safetensors"]


def test_a_corrupt_download_is_removed_and_refused(hub, tmp_path):
    hub.corrupt.add("model-00002-of-00002.safetensors")
    rc, out = fetch(hub, tmp_path / "model")
    assert rc == 1 and "another size or hash" in out["message"], out
    assert not (tmp_path / "model/model-00002-of-00002.safetensors").exists()


def test_a_branch_is_refused_and_a_bad_token_is_the_hubs_error(hub, tmp_path):
    rc, out = fetch(hub, tmp_path / "model", "main")
    assert rc == 2 and "not a commit hash" in out["message"]
    rc, out = fetch(hub, tmp_path / "model", "main", "--allow-branch")
    assert rc == 0 and out["commit"] == COMMIT
    rc, out = fetch(hub, tmp_path / "other", COMMIT, token="hf_wrong")
    assert rc == 6 and "refused" in out["message"]


@pytest.mark.slow
def test_the_role_downloads_with_a_token_it_never_logs(hub, tmp_path, loopback_ssh):
    if os.geteuid() != 0:
        pytest.skip("the loopback box is provisioned as root")
    from dsv4kit.provision import run_playbook

    prefix = tmp_path / "prefix"
    model = prefix / "models/DeepSeek-V4-Flash"
    inventory = write_loopback_inventory(
        tmp_path / "inv", loopback_ssh, prefix,
        overrides={"dsv4_model_path": str(model), "dsv4_model_revision": COMMIT, "dsv4_hf_token": TOKEN},
        # The Python running the tests has huggingface_hub (on a box: the SGLang venv's).
        role_vars={"model_weights_fetch": True, "model_weights_endpoint": hub.endpoint,
                   "model_weights_python": sys.executable})
    lines: list[str] = []
    summary = run_playbook(inventory, tags=["model_weights"], progress=lines.append, timeout=600)
    log = "\n".join(lines)
    assert summary.exit_code == 0, log[-4000:]
    assert TOKEN not in log and summary.hosts["loop"]["changed"] > 0
    assert (model / "config.json").read_bytes() == FILES["config.json"]
    lines.clear()
    summary = run_playbook(inventory, tags=["model_weights"], progress=lines.append, timeout=600)
    assert summary.exit_code == 0 and summary.hosts["loop"]["changed"] == 0, "\n".join(lines[-60:])
    # Another revision pinned over this directory: refused, the message says what to do.
    lines.clear()
    summary = run_playbook(inventory, tags=["model_weights"], progress=lines.append, timeout=600,
                           extra_vars={"dsv4_model_revision": "f" * 40})
    assert summary.exit_code == 6 and "the hub refused" in "\n".join(lines)
