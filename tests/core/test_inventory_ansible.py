"""The inventory means to dsv4kit what it means to Ansible: real INI and YAML files, the shipped
group_vars with its Jinja values, vaulted values encrypted by the real ansible-vault, and errors
that name the file (and line) holding the bad value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsv4kit.core.inventory import InventoryError, VaultedValue, load_inventory

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def inventory_dir(tmp_path: Path, hosts_file: str, text: str, **group_vars) -> Path:
    """An inventory as a user keeps one: the shipped group_vars/all.yml (its text, comments and
    Jinja included), plus ``group_vars`` lines appended, and ``hosts_file`` beside it."""
    (tmp_path / "group_vars").mkdir(parents=True)
    extra = "".join(f"{name}: {value}\n" for name, value in group_vars.items())
    (tmp_path / "group_vars/all.yml").write_text((REPO / "inventory/group_vars/all.yml").read_text() + extra)
    (tmp_path / hosts_file).write_text(text)
    return tmp_path / hosts_file


INI = """\
[dsv4_boxes]
box1 ansible_host=10.0.0.5 ansible_user=ops dsv4_validate_gpu=6
box2 ansible_host=10.0.0.6 ansible_port=2222

[dsv4_boxes:vars]
dsv4_max_running_requests=32
ansible_python_interpreter=/usr/bin/python3
"""


def test_an_ini_inventory_reads_as_ansible_reads_it(tmp_path):
    inv = load_inventory(inventory_dir(tmp_path, "hosts.ini", INI))
    one, two = inv.host("box1"), inv.host("box2")
    assert (one.address, one.user, one.get("dsv4_validate_gpu")) == ("10.0.0.5", "ops", 6)
    assert (two.address, two.port) == ("10.0.0.6", 2222)
    assert type(one["dsv4_validate_gpu"]) is int and two["dsv4_validate_gpu"] == 7  # host line > group_vars
    assert two["ansible_python_interpreter"] == "/usr/bin/python3"
    # Ansible's order: group_vars/all.yml beside the file beats the file's own [group:vars].
    assert one["dsv4_max_running_requests"] == 64 and one["dsv4_context_length"] == 131072
    assert "dsv4_boxes" in one.groups


def test_jinja_values_are_templated(tmp_path):
    path = inventory_dir(tmp_path, "hosts.yml", yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": {
        "box1": {"dsv4_decode_port": 31002, "dsv4_prefill_port": "{{ dsv4_decode_port - 1 }}",
                 "dsv4_state_dir": "/var/lib/dsv4kit/{{ inventory_hostname }}"}}}}}}))
    host = load_inventory(path).host()
    assert "torch==2.14.1" in host["dsv4_venv_packages"]  # "torch=={{ dsv4_torch_version }}" in all.yml
    assert host["dsv4_prefill_port"] == 31001 and type(host["dsv4_prefill_port"]) is int
    assert host["dsv4_state_dir"] == "/var/lib/dsv4kit/box1"
    assert "-o UserKnownHostsFile=~/.ssh/known_hosts " in host["ansible_ssh_common_args"]
    yaml.safe_dump(host.vars)  # plain Python values, as the rest of dsv4kit writes them


def test_a_bad_value_in_group_vars_is_reported_against_group_vars(tmp_path):
    path = inventory_dir(tmp_path, "hosts.yml", yaml.safe_dump({"all": {"hosts": {"box1": None}}}),
                         dsv4_max_running_requests="lots")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    line = (tmp_path / "group_vars/all.yml").read_text().splitlines().index("dsv4_max_running_requests: lots") + 1
    assert message.startswith(f"{tmp_path / 'group_vars/all.yml'}:{line}: host 'box1': "
                              "field 'dsv4_max_running_requests' must be int, got str 'lots'"), message
    assert "hosts.yml" not in message


def test_role_variables_in_a_group_vars_yaml_file_are_the_users_own(tmp_path):
    """Role settings (tests/journey's preflight and weights knobs) set where a user sets them."""
    path = inventory_dir(tmp_path, "hosts.yml", yaml.safe_dump(
        {"all": {"children": {"dsv4_boxes": {"hosts": {"box1": None}}}}}))
    (tmp_path / "group_vars/dsv4_boxes.yml").write_text(
        "preflight_supported_os: ['Ubuntu 24.04']\nmodel_weights_enabled: false\n")
    host = load_inventory(path).host()
    assert host["preflight_supported_os"] == ["Ubuntu 24.04"] and host["model_weights_enabled"] is False
    assert host.origin("model_weights_enabled") == f"{tmp_path / 'group_vars/dsv4_boxes.yml'}:2"


@pytest.mark.parametrize("value, got", [("true", "bool True"), ("null", "NoneType None")])
def test_a_bool_or_null_value_is_reported_where_it_is_written(tmp_path, value, got):
    """Ansible tags no origin on a YAML bool or null: the file and line are found by name."""
    path = inventory_dir(tmp_path, "hosts.yml", yaml.safe_dump(
        {"all": {"children": {"dsv4_boxes": {"hosts": {"box1": None}}}}}))
    (tmp_path / "group_vars/dsv4_boxes.yml").write_text(f"# the box group\ndsv4_gpu_count: {value}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"{tmp_path / 'group_vars/dsv4_boxes.yml'}:2: host 'box1': field "
                                      f"'dsv4_gpu_count' must be int, got {got}"), info.value


def test_an_undefined_jinja_name_is_reported_against_its_file(tmp_path):
    path = inventory_dir(tmp_path, "hosts.ini", "[dsv4_boxes]\nbox1\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/box1.yml").write_text('dsv4_model_path: "/models/{{ model_dir }}"\n')
    with pytest.raises(InventoryError, match=rf"^{tmp_path / 'host_vars/box1.yml'}:1: host 'box1': "
                                             r"dsv4_model_path: 'model_dir' is undefined"):
        load_inventory(path)


@pytest.mark.parametrize("name, text, words", [
    ("hosts.yml", "all:\n  hosts:\n    box1: {ansible_port: 22\n", "cannot read it as a YAML inventory: YAML parsing failed"),
    ("hosts.ini", "[dsv4_boxes\nbox1\n", "cannot read it as an INI inventory"),
    ("hosts.yml", "all:\n  hostz:\n    box1:\n", "Skipping unexpected key (hostz) in group (all)"),
])
def test_a_file_ansible_cannot_read_is_named(tmp_path, name, text, words):
    path = inventory_dir(tmp_path, name, text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value).startswith(str(path)) and words in str(info.value), info.value


def test_broken_yaml_in_group_vars_names_group_vars(tmp_path):
    path = inventory_dir(tmp_path, "hosts.ini", "[dsv4_boxes]\nbox1\n", dsv4_decode_gpus="[4, 5")
    with pytest.raises(InventoryError, match=rf"^{tmp_path / 'group_vars/all.yml'}:\d+: YAML parsing failed"):
        load_inventory(path)


# ------------------------------------------------------------------------------------ Vault
def _vaulted(tmp_path: Path, name: str, secret: str) -> str:
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    proc = subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password),
                           secret, "--name", name], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _read_host(path: Path, env: dict) -> subprocess.CompletedProcess:
    """A fresh process, as the CLI is: Ansible's configuration comes from its environment."""
    code = ("import json, sys\nfrom dsv4kit.core.inventory import InventoryError, VaultedValue, load_inventory\n"
            "try:\n    h = load_inventory(sys.argv[1]).host()\nexcept InventoryError as e:\n"
            "    print(e, file=sys.stderr); sys.exit(2)\n"
            "print(json.dumps({k: [str(h[k]), isinstance(h[k], VaultedValue)] for k in sys.argv[2:]}))\n")
    return subprocess.run([sys.executable, "-c", code, str(path), "dsv4_router_api_key", "dsv4_hf_token"],
                          capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}, **env})


def test_a_vaulted_value_opens_with_ansibles_configured_secret(tmp_path):
    path = inventory_dir(tmp_path / "inv", "hosts.ini", "[dsv4_boxes]\nbox1\n")
    all_yml = tmp_path / "inv/group_vars/all.yml"
    text = all_yml.read_text().replace('dsv4_router_api_key: ""', "").replace('dsv4_hf_token: ""', "")
    all_yml.write_text(text + _vaulted(tmp_path, "dsv4_router_api_key", "s3cret-router-key")
                       + 'dsv4_hf_token: "hf-{{ dsv4_router_api_key }}"\n')
    clean: dict = {}
    proc = _read_host(path, {**clean, "ANSIBLE_VAULT_PASSWORD_FILE": str(tmp_path / "vault-pass")})
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == {"dsv4_router_api_key": ["s3cret-router-key", False],
                                           "dsv4_hf_token": ["hf-s3cret-router-key", False]}
    proc = _read_host(path, clean)  # no secret: the values stay sealed, and the inventory still loads
    assert proc.returncode == 0, proc.stderr
    sealed = yaml.safe_load(proc.stdout)
    assert sealed["dsv4_router_api_key"][1] and "$ANSIBLE_VAULT" in sealed["dsv4_router_api_key"][0]
    assert sealed["dsv4_hf_token"][1] and "s3cret" not in proc.stdout
    (tmp_path / "wrong").write_text("battery staple\n")
    proc = _read_host(path, {**clean, "ANSIBLE_VAULT_PASSWORD_FILE": str(tmp_path / "wrong")})
    assert proc.returncode == 2 and proc.stderr.startswith(f"{all_yml}:"), proc.stderr
    assert "dsv4_router_api_key: cannot decrypt it with the vault secrets given" in proc.stderr


def test_vault_secrets_can_be_handed_in(tmp_path):
    from ansible.parsing.vault import VaultSecret

    path = inventory_dir(tmp_path / "inv", "hosts.yml", yaml.safe_dump({"all": {"hosts": {"box1": None}}}))
    all_yml = tmp_path / "inv/group_vars/all.yml"
    all_yml.write_text(all_yml.read_text().replace('dsv4_router_api_key: ""', "")
                       + _vaulted(tmp_path, "dsv4_router_api_key", "k"))
    assert isinstance(load_inventory(path).host()["dsv4_router_api_key"], VaultedValue)
    opened = load_inventory(path, vault_secrets=[("default", VaultSecret(b"correct horse"))]).host()
    assert opened["dsv4_router_api_key"] == "k" and not isinstance(opened["dsv4_router_api_key"], VaultedValue)


def test_the_shipped_examples_match_ansible_inventory():
    from tests.core.test_inventory import ansible_inventory

    for name in ("hosts.yml", "fleet.yml"):
        inv = load_inventory(REPO / "inventory" / name)
        for host, values in ansible_inventory(REPO / "inventory" / name).items():
            assert {k: v for k, v in values.items() if "{{" not in str(v)} == \
                   {k: inv.host(host).vars[k] for k, v in values.items() if "{{" not in str(v)}, host



def test_the_users_own_variables_pass_and_a_misspelt_connection_variable_does_not(tmp_path):
    path = inventory_dir(tmp_path, "hosts.ini", "[dsv4_boxes]\nbox1 ansible_host=\"{{ box_address }}\"\n")
    # Role variables and Jinja helpers, in a JSON file Ansible reads as it reads YAML.
    (tmp_path / "group_vars/dsv4_boxes.json").write_text('{"box_address": "10.0.0.9", "model_weights_enabled": false}')
    host = load_inventory(path).host()
    assert host.address == "10.0.0.9" and host["model_weights_enabled"] is False
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/box1.yml").write_text("ansbile_user: ops\n")
    with pytest.raises(InventoryError, match=r"host_vars/box1.yml:1: host 'box1': unknown field 'ansbile_user' "
                                             r"\(did you mean 'ansible_user'\?\)"):
        load_inventory(path)


def test_a_host_outside_dsv4_boxes_is_not_targeted(tmp_path):
    """A bastion in `all` (dsv4kit's variables kept in group_vars/dsv4_boxes.yml) is not one of the
    boxes: Ansible's meaning, since playbooks/site.yml targets dsv4_boxes only."""
    inv_dir = tmp_path / "inv"
    (inv_dir / "group_vars").mkdir(parents=True)
    (inv_dir / "group_vars/dsv4_boxes.yml").write_text((REPO / "inventory/group_vars/all.yml").read_text())
    path = inv_dir / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"bastion": {"ansible_host": "192.0.2.99"}},
                                            "children": {"dsv4_boxes": {"hosts": {"gpu01": {"ansible_host": "192.0.2.10"}}}}}}))
    inv = load_inventory(path)
    assert list(inv.hosts) == ["gpu01"] and inv.host().name == "gpu01"
    listed = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(path), "--graph", "dsv4_boxes"],
                            capture_output=True, text=True, check=True).stdout
    assert "gpu01" in listed and "bastion" not in listed  # what the play targets


def test_ini_group_vars_connection_values_are_converted_as_ansible_does(tmp_path):
    """`[group:vars]` values are strings in an INI inventory; Ansible converts its own connection
    variables (ansible_become=true, ansible_port=2222) when it uses them."""
    text = "[dsv4_boxes]\nbox1 ansible_host=10.0.0.5\n\n[dsv4_boxes:vars]\nansible_become=true\nansible_port=2222\n"
    host = load_inventory(inventory_dir(tmp_path, "hosts.ini", text)).host()
    assert host["ansible_become"] is True and host.port == 2222
    bad = inventory_dir(tmp_path / "bad", "hosts.ini", text.replace("=true", "=maybe"))
    with pytest.raises(InventoryError, match="ansible_become' must be bool, got str 'maybe'"):
        load_inventory(bad)
