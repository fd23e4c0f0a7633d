"""The model_weights stage, run for real: `dsv4kit provision --tags ...` (ansible-playbook) against the
loopback sshd, the box's venv holding the real huggingface_hub, and a stand-in hub on 127.0.0.1
(tests/fake_hf_hub.py: gated, redirects to a "CDN" that refuses the token and cuts a download).

Ansible runs at verbosity 3 (connection commands and module results shown) wherever a token is in
play, and the token must appear in none of its output.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_hf_hub import FakeHub, tiny_repo
from tests.provision_inventory import TINY_PACKAGES, write_loopback_inventory

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_dsv4kitGoodToken5f1c9a2e"
BAD_TOKEN = "hf_dsv4kitWrongToken0b7e4d"
# What the box's venv gets through SGLang 0.5.23 -> transformers==5.19.0 (its Requires-Dist).
HUB_REQUIREMENT = "huggingface_hub>=1.31.0,<3.0"
SERVICE_USER = "nobody"  # an existing user other than root: ownership is visible


@pytest.fixture(scope="module")
def hub():
    server = FakeHub(tiny_repo(), token=TOKEN).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the loopback box is provisioned as root (apt package list, file ownership)")
    base = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    return dict(base, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")),
                ANSIBLE_LOCAL_TEMP=str(tmp_path_factory.mktemp("ansible-tmp")))


def inventory_for(directory: Path, sshd, prefix: Path, hub: FakeHub, model_path: Path, role_vars: dict | None = None,
                  **overrides) -> Path:
    values = {"dsv4_model_repo": hub.repo.repo_id, "dsv4_model_revision": hub.repo.commit,
              "dsv4_model_path": str(model_path), "dsv4_service_user": SERVICE_USER,
              "dsv4_venv_packages": [*TINY_PACKAGES, HUB_REQUIREMENT], **overrides}
    return write_loopback_inventory(directory, sshd, prefix, overrides=values,
                                    role_vars={"model_weights_enabled": True, "model_weights_endpoint": hub.url,
                                               **(role_vars or {})})


def provision(inventory: Path, env: dict, *args: str, token: str | None = None, verbose: bool = False):
    run_env = dict(env)
    if token is not None:
        run_env["HF_TOKEN"] = token
    if verbose:
        run_env["ANSIBLE_VERBOSITY"] = "3"
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "-i", str(inventory), "--json", *args],
                          env=run_env, capture_output=True, text=True, timeout=900)


def changed(result) -> int:
    assert result.stdout.strip(), result.stderr[-4000:]
    return json.loads(result.stdout)["hosts"]["loop"]["changed"]


@pytest.fixture(scope="module")
def box(loopback_ssh, env, hub, tmp_path_factory):
    """The venv installed, then the weights fetched with the token from the environment:
    (root, prefix, model path, first weights run)."""
    root = tmp_path_factory.mktemp("box")
    prefix, model = root / "prefix", root / "prefix/models/Tiny-V4"
    inventory = inventory_for(root / "inventory", loopback_ssh, prefix, hub, model)
    venv = provision(inventory, env, "--tags", "sglang_venv")
    assert venv.returncode == 0, venv.stderr[-6000:]
    from tests.sudo_login import ProcessWatch

    # Every process's argv (any user's `ps`) and non-root environment, read while the token is in play.
    with ProcessWatch(TOKEN, marker="--token-stdin", interval=0.05).running() as watch:
        first = provision(inventory, env, "--tags", "model_weights", token=TOKEN, verbose=True)
    first.token_seen_in = sorted(watch.found)
    return root, prefix, model, inventory, first


def test_fresh_download_is_verified_and_owned_by_the_service_user(box, hub):
    _, prefix, model, _, first = box
    assert first.returncode == 0, first.stderr[-8000:]
    assert changed(first) > 0
    for name, data in hub.repo.files.items():
        assert (model / name).read_bytes() == data, name
    marker = json.loads((model / ".dsv4kit-weights.json").read_text())
    assert marker["repo"] == hub.repo.repo_id and marker["revision"] == hub.repo.commit
    assert sorted(marker["files"]) == sorted(hub.repo.files)
    nobody = pwd.getpwnam(SERVICE_USER)
    for path in [model, *model.rglob("*")]:
        assert (path.stat().st_uid, path.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid), path
    assert "downloaded 6 of 6 files" in first.stderr
    log = (prefix / "var/lib/dsv4kit/logs/model-weights.log").read_text()
    assert "downloaded model-00001-of-00002.safetensors (200000 bytes)" in log and "all 6 files verified" in log
    # The hub got the token; the CDN never did (it refuses one); the cut download was resumed.
    assert any(auth == f"Bearer {TOKEN}" for _, _, auth in hub.requests)
    assert all(auth is None for _, path, auth in hub.requests if path.startswith("/cdn/"))
    assert any(method == "GET" and path.startswith("/cdn/") for method, path, _ in hub.requests)
    # -vvv shows every command and result: the token is in none of it.
    assert "SSH: EXEC" in first.stderr
    assert TOKEN not in first.stdout + first.stderr
    assert not first.token_seen_in, first.token_seen_in


def test_second_run_changes_nothing_and_asks_the_hub_nothing(box, env, hub):
    _, _, model, inventory, first = box
    assert first.returncode == 0, first.stderr[-4000:]
    before = len(hub.requests)
    second = provision(inventory, env, "--tags", "model_weights")  # no token needed any more
    assert second.returncode == 0, second.stderr[-6000:]
    assert changed(second) == 0, second.stderr[-6000:]
    assert "verified earlier, files unchanged" in second.stderr
    assert len(hub.requests) == before
    check = provision(inventory, env, "--tags", "model_weights", "--check")
    assert check.returncode == 0 and changed(check) == 0, check.stderr[-6000:]


def test_a_corrupted_file_is_named_and_never_overwritten(box, env, hub, loopback_ssh):
    """Bit rot keeps size and mtime: the marker's quick check cannot see it, model_weights_rehash can."""
    root, prefix, model, inventory, first = box
    assert first.returncode == 0
    shard = model / "model-00002-of-00002.safetensors"
    stat, good = shard.stat(), shard.read_bytes()
    bad = bytes([good[0] ^ 0xFF]) + good[1:]
    try:
        shard.write_bytes(bad)
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        quick = provision(inventory, env, "--tags", "model_weights")
        assert quick.returncode == 0 and changed(quick) == 0
        rehash_inventory = inventory_for(root / "inventory-rehash", loopback_ssh, prefix, hub, model,
                                         role_vars={"model_weights_rehash": True})
        full = provision(rehash_inventory, env, "--tags", "model_weights", token=TOKEN)
        assert full.returncode == 6, full.stderr[-6000:]
        assert "model-00002-of-00002.safetensors: sha256" in full.stderr and "nothing is overwritten" in full.stderr
        assert shard.read_bytes() == bad
    finally:
        shard.write_bytes(good)
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_foreign_directory_is_refused_by_name(box, env, hub, loopback_ssh):
    root, prefix, _, _, first = box
    assert first.returncode == 0
    foreign = prefix / "models/Other"
    (foreign / "encoding").mkdir(parents=True)
    (foreign / "config.json").write_text('{"architectures": ["SomethingElse"]}')
    (foreign / "other-00001.safetensors").write_bytes(b"\0" * 4096)
    before = {p: p.read_bytes() for p in foreign.rglob("*") if p.is_file()}
    downloads = len(hub.downloads())
    inventory = inventory_for(root / "inventory-foreign", loopback_ssh, prefix, hub, foreign)
    result = provision(inventory, env, "--tags", "model_weights", token=TOKEN)
    assert result.returncode == 6, result.stderr[-6000:]
    assert "config.json: size" in result.stderr
    assert "other-00001.safetensors: not a file of the revision" in result.stderr
    assert {p: p.read_bytes() for p in foreign.rglob("*") if p.is_file()} == before
    assert not (foreign / ".dsv4kit-weights.json").exists() and len(hub.downloads()) == downloads


def test_a_bad_token_is_refused_clearly_and_never_shown(box, env, hub, loopback_ssh):
    root, prefix, _, _, first = box
    assert first.returncode == 0
    model = prefix / "models/BadToken"
    inventory = inventory_for(root / "inventory-bad-token", loopback_ssh, prefix, hub, model)
    result = provision(inventory, env, "--tags", "model_weights", token=BAD_TOKEN, verbose=True)
    assert result.returncode == 6, result.stderr[-6000:]
    assert "the hub rejected the token (401 Unauthorized)" in result.stderr
    assert "dsv4_hf_token" in result.stderr and "HF_TOKEN" in result.stderr
    assert any(auth == f"Bearer {BAD_TOKEN}" for _, _, auth in hub.requests)
    assert BAD_TOKEN not in result.stdout + result.stderr
    assert not model.exists() or not any(model.iterdir())
    # No token at all for the gated repository: said as such.
    anonymous = provision(inventory, env, "--tags", "model_weights")
    assert anonymous.returncode == 6 and "is gated: give a token" in anonymous.stderr, anonymous.stderr[-4000:]


def test_a_vaulted_style_inventory_token_is_used_and_not_shown(box, env, hub, loopback_ssh):
    """dsv4_hf_token in the inventory (where a vaulted value goes) wins over the environment."""
    root, prefix, _, _, first = box
    assert first.returncode == 0
    model = prefix / "models/InventoryToken"
    inventory = inventory_for(root / "inventory-token", loopback_ssh, prefix, hub, model, dsv4_hf_token=TOKEN)
    result = provision(inventory, env, "--tags", "model_weights", token=BAD_TOKEN, verbose=True)
    assert result.returncode == 0, result.stderr[-6000:]
    assert (model / "config.json").read_bytes() == hub.repo.files["config.json"]
    assert TOKEN not in result.stdout + result.stderr and BAD_TOKEN not in result.stdout + result.stderr


def test_an_unpinned_revision_is_refused_before_any_request(box, env, hub, loopback_ssh):
    root, prefix, _, _, first = box
    assert first.returncode == 0
    before = len(hub.requests)
    model = prefix / "models/Unpinned"
    inventory = inventory_for(root / "inventory-unpinned", loopback_ssh, prefix, hub, model, dsv4_model_revision="main")
    result = provision(inventory, env, "--tags", "model_weights", token=TOKEN)
    assert result.returncode == 6, result.stderr[-6000:]
    assert 'dsv4_model_revision is "main", not a commit hash' in result.stderr
    assert "dsv4_model_allow_unpinned: true" in result.stderr
    assert len(hub.requests) == before and not model.exists()
    # Allowed explicitly: main is resolved to its commit, and that commit is what is recorded.
    allowed = inventory_for(root / "inventory-unpinned", loopback_ssh, prefix, hub, model, dsv4_model_revision="main",
                            dsv4_model_allow_unpinned=True)
    check = provision(allowed, env, "--tags", "model_weights", "--check", token=TOKEN)
    assert check.returncode == 0 and changed(check) > 0, check.stderr[-6000:]
    assert "would download 6 of 6 files" in check.stderr and not model.exists()
    result = provision(allowed, env, "--tags", "model_weights", token=TOKEN)
    assert result.returncode == 0, result.stderr[-6000:]
    assert json.loads((model / ".dsv4kit-weights.json").read_text())["revision"] == hub.repo.commit
    again = provision(allowed, env, "--tags", "model_weights", token=TOKEN)
    assert again.returncode == 0 and changed(again) == 0, again.stderr[-6000:]


def test_an_interrupted_download_resumes_with_what_is_there(box, env, hub, loopback_ssh):
    """Files that are there and match are kept (a stopped run, weights copied in by hand); only the
    rest is fetched, then all of it is recorded."""
    root, prefix, verified, _, first = box
    assert first.returncode == 0
    model = prefix / "models/Resumed"
    kept = ["config.json", "model-00001-of-00002.safetensors"]
    for name in kept:
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes((verified / name).read_bytes())
    before = len(hub.downloads())
    inventory = inventory_for(root / "inventory-resumed", loopback_ssh, prefix, hub, model)
    # The model's disk too small (a filesystem of its own): refused before any download, with the sizes.
    import subprocess as sp

    if sp.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(model)], capture_output=True).returncode == 0:
        try:
            full = provision(inventory, env, "--tags", "model_weights", token=TOKEN)
        finally:
            sp.run(["umount", str(model)], check=True)
        assert full.returncode == 6, full.stderr[-6000:]
        assert f"{model} has 0.00 GiB free" in full.stderr and "the 6 missing files of the revision need" in full.stderr
        assert "point dsv4_model_path at a larger disk" in full.stderr and len(hub.downloads()) == before
    result = provision(inventory, env, "--tags", "model_weights", token=TOKEN)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "downloaded 4 of 6 files" in result.stderr
    fetched = hub.downloads()[before:]
    assert len(fetched) == 4 and not any(name in path for path in fetched for name in kept)
    assert sorted(json.loads((model / ".dsv4kit-weights.json").read_text())["files"]) == sorted(hub.repo.files)


def test_a_token_from_ansible_vault_is_used_and_not_shown(box, env, hub, loopback_ssh, tmp_path):
    """dsv4_hf_token as a real `!vault` value (ansible-vault encrypt_string), run with ansible-playbook
    itself and a vault password file, at verbosity 3."""
    root, prefix, _, _, first = box
    assert first.returncode == 0
    bindir = Path(sys.executable).parent
    model = prefix / "models/Vaulted"
    inventory = inventory_for(root / "inventory-vault", loopback_ssh, prefix, hub, model)
    password = tmp_path / "vault-pass"
    password.write_text("dsv4kit-test-vault-password\n")
    vaulted = subprocess.run([str(bindir / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password),
                              "--name", "dsv4_hf_token", TOKEN], capture_output=True, text=True, timeout=120, env=env)
    assert vaulted.returncode == 0 and "!vault" in vaulted.stdout, vaulted.stderr
    (inventory.parent / "host_vars").mkdir()
    (inventory.parent / "host_vars/loop.yml").write_text("---\n" + vaulted.stdout)
    assert TOKEN not in (inventory.parent / "host_vars/loop.yml").read_text()
    result = subprocess.run([str(bindir / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks/site.yml"),
                             "--tags", "model_weights", "--vault-password-file", str(password), "-vvv"],
                            env={**env, "HF_TOKEN": BAD_TOKEN}, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:]
    assert (model / "config.json").read_bytes() == hub.repo.files["config.json"]
    assert TOKEN not in result.stdout + result.stderr and BAD_TOKEN not in result.stdout + result.stderr
