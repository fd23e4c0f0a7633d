import json
from pathlib import Path

import pytest
import yaml

from dsv4kit.core.inventory import InventoryError, load_inventory

REPO = Path(__file__).resolve().parents[2]


def write_inventory(tmp_path, hosts, group_vars=None, host_vars=None):
    (tmp_path / "group_vars").mkdir()
    all_vars = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    all_vars.update(group_vars or {})
    (tmp_path / "group_vars/all.yml").write_text(yaml.safe_dump(all_vars))
    for name, values in (host_vars or {}).items():
        (tmp_path / "host_vars").mkdir(exist_ok=True)
        (tmp_path / f"host_vars/{name}.yml").write_text(yaml.safe_dump(values))
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": hosts}}}}))
    return path


@pytest.mark.parametrize("name", ["hosts.yml", "fleet.yml"])
def test_shipped_examples_load(name):
    inventory = load_inventory(REPO / "inventory" / name)
    for host in inventory.hosts.values():
        assert host["dsv4_sglang_version"] == "0.5.23"
        assert host["dsv4_prefill_gpus"] == [0, 1, 2, 3] and host["dsv4_decode_gpus"] == [4, 5, 6, 7]


def test_precedence_all_group_host(tmp_path):
    path = write_inventory(tmp_path, {"a": {"dsv4_context_length": 8192}, "b": None},
                           host_vars={"b": {"dsv4_decode_port": 31000}})
    inv = load_inventory(path)
    assert inv.host("a")["dsv4_context_length"] == 8192
    assert inv.host("b")["dsv4_context_length"] == 131072
    assert inv.host("b")["dsv4_decode_port"] == 31000


def test_precedence_through_nested_groups_is_ansibles(tmp_path):
    """Ansible's order, from its own ansible-inventory: inventory-file group vars (parent < child)
    < group_vars/all < group_vars/<group> < host inline < host_vars/."""
    (tmp_path / "group_vars").mkdir()
    all_vars = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    (tmp_path / "group_vars/all.yml").write_text(yaml.safe_dump(all_vars))
    (tmp_path / "group_vars/rack.yml").write_text(yaml.safe_dump({"dsv4_decode_port": 31001}))
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/c.yml").write_text(yaml.safe_dump({"dsv4_router_port": 9003}))
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"site": {
        "vars": {"dsv4_mem_fraction_static": 0.7, "dsv4_cuda_graph_max_bs_decode": 32},
        "children": {"rack": {
            "vars": {"dsv4_mem_fraction_static": 0.75, "dsv4_decode_port": 31000, "dsv4_prefill_port": 31002},
            "hosts": {"a": None, "b": {"dsv4_context_length": 1024}, "c": {"dsv4_router_port": 9002}},
        }},
        "hosts": {"d": None},
    }}}}))
    inv = load_inventory(path)
    assert inv.host("a")["dsv4_context_length"] == 131072  # group_vars/all beats inventory-file group vars
    assert inv.host("a")["dsv4_decode_port"] == 31001  # group_vars/rack beats rack's inline vars
    assert inv.host("a")["dsv4_prefill_port"] == 30001  # group_vars/all beats even a child's inline vars
    assert inv.host("b")["dsv4_context_length"] == 1024
    assert inv.host("c")["dsv4_router_port"] == 9003
    assert inv.host("a").groups == ["all", "site", "rack"]
    theirs = ansible_inventory(path)
    assert set(theirs) == set(inv.hosts)
    for name, values in theirs.items():  # the values Ansible leaves untemplated are compared elsewhere
        plain = {k: v for k, v in values.items() if "{{" not in json.dumps(v)}
        assert plain == {k: inv.host(name).vars[k] for k in plain}, name


def ansible_inventory(path):
    """Every host's dsv4_* and ansible_* variables as the real ``ansible-inventory --list`` gives them."""
    import subprocess
    import sys

    tool = Path(sys.executable).parent / "ansible-inventory"
    proc = subprocess.run([str(tool), "-i", str(path), "--list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    return {host: {k: v for k, v in values.items() if k.startswith(("dsv4_", "ansible_"))}
            for host, values in hostvars.items()}


def test_missing_file():
    with pytest.raises(InventoryError, match="not found"):
        load_inventory("/nonexistent/hosts.yml")


def test_missing_host_is_named(tmp_path):
    inv = load_inventory(write_inventory(tmp_path, {"box1": None}))
    with pytest.raises(InventoryError, match="no host named 'box9'.*box1"):
        inv.host("box9")


def test_unknown_field_suggests_the_right_one(tmp_path):
    path = write_inventory(tmp_path, {"box1": {"dsv4_contxt_length": 8192}})
    with pytest.raises(InventoryError, match="unknown field 'dsv4_contxt_length'.*dsv4_context_length"):
        load_inventory(path)


def test_wrong_type_is_named(tmp_path):
    path = write_inventory(tmp_path, {"box1": {"dsv4_context_length": "lots"}})
    with pytest.raises(InventoryError, match="'dsv4_context_length' must be int"):
        load_inventory(path)


def test_overlapping_gpu_split(tmp_path):
    path = write_inventory(tmp_path, {"box1": {"dsv4_decode_gpus": [3, 4, 5, 6]}})
    with pytest.raises(InventoryError, match="GPU 3 is in both"):
        load_inventory(path)


@pytest.mark.parametrize("field, value, message", [
    ("dsv4_venv_dir", "/opt/my venv", "dsv4_venv_dir must not contain whitespace"),
    ("dsv4_model_path", "/models/DeepSeek$V4", "dsv4_model_path must not contain"),
    ("dsv4_model_path", "models/DeepSeek-V4-Flash", "dsv4_model_path must be an absolute path"),
    ("dsv4_package_timeout", 0, "dsv4_package_timeout must be a positive number of seconds"),
    ("dsv4_health_timeout", -5, "dsv4_health_timeout must be a positive"),
])
def test_unusable_paths_and_timeouts_are_named(tmp_path, field, value, message):
    path = write_inventory(tmp_path, {"box1": {field: value}})
    with pytest.raises(InventoryError, match=message):
        load_inventory(path)


@pytest.mark.parametrize("value", [True, False, "auto"])
def test_the_fp4_indexer_setting_takes_true_false_or_auto(tmp_path, value):
    assert load_inventory(write_inventory(tmp_path, {"box1": {"dsv4_fp4_indexer": value}})).host("box1")[
        "dsv4_fp4_indexer"] == value


@pytest.mark.parametrize("value, message", [
    ("on", r"hosts.yml:\d+: host 'box1': dsv4_fp4_indexer must be true, false or 'auto', got 'on'"),
    (1, "'dsv4_fp4_indexer' must be bool or str, got int 1"),
])
def test_another_fp4_indexer_value_is_refused_naming_the_file(tmp_path, value, message):
    with pytest.raises(InventoryError, match=message):
        load_inventory(write_inventory(tmp_path, {"box1": {"dsv4_fp4_indexer": value}}))


def test_bad_key_path(tmp_path):
    inv = load_inventory(write_inventory(tmp_path, {"box1": {"ansible_ssh_private_key_file": str(tmp_path / "nokey")}}))
    with pytest.raises(InventoryError, match="does not exist"):
        inv.host("box1").check_connectable()


def test_a_context_length_beyond_the_models_maximum_is_named(tmp_path):
    path = write_inventory(tmp_path, {"box1": {"dsv4_context_length": 2097152}})
    with pytest.raises(InventoryError, match=r"hosts.yml:\d+: host 'box1': dsv4_context_length 2097152 exceeds the "
                                             r"model's maximum, dsv4_model_max_context_length 1048576 \(.*group_vars/all.yml:\d+\)"):
        load_inventory(path)


@pytest.mark.parametrize("empty", ["dsv4_prefill_gpus", "dsv4_decode_gpus"])
def test_tp8_without_pd_is_refused_as_input(tmp_path, empty):
    """All eight GPUs in one set: the other server's unit would start SGLang with --tp 0."""
    other = "dsv4_decode_gpus" if empty == "dsv4_prefill_gpus" else "dsv4_prefill_gpus"
    path = write_inventory(tmp_path, {"box1": {empty: [], other: list(range(8))}})
    with pytest.raises(InventoryError, match=f"{empty} is empty: dsv4kit serves with prefill and decode disaggregated"):
        load_inventory(path)
