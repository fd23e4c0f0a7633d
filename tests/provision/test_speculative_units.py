"""Every model and speculative choice the inventory allows, rendered into the serving units by Ansible
(the role's template and defaults, the tracked pins) and put through SGLang 0.5.23's own argument
pipeline as an sm_120 machine (tests/sglang_resolve_worker.py), prefill and decode of the PD pair
alike; and every choice the toolkit refuses at input is one SGLang refuses too, for the reason the
toolkit quotes (dsv4kit.core.speculative)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsv4kit.core import speculative
from tests.service_units import REPO, ROLE
from tests.sglang_wheel import sglang_site

PINS = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
ORIGINAL, V0731 = "DeepSeek-V4-Flash", "DeepSeek-V4-Flash-0731"

#: What the inventory allows: every model x every speculative setting its drafter permits.
ALLOWED = {
    f"{model}/{algorithm}": {"dsv4_model": model, "dsv4_speculative": algorithm}
    for model in (ORIGINAL, V0731) for algorithm in speculative.ALGORITHMS
    if not (algorithm == "DSPARK" and not PINS["dsv4_models"][model]["drafter"])
    and not (algorithm == "EAGLE" and PINS["dsv4_models"][model]["drafter"] == speculative.BUNDLED)
}
# A drafter shipped as a folder of the revision (SGLang 0.5.23's other convention): a model of its own.
FOLDER = "Folder-Drafter"
MODELS = {**PINS["dsv4_models"], FOLDER: {"repo": "dsv4kit-test/Folder-Drafter", "revision": "0" * 40, "drafter": "dspark"}}
ALLOWED[f"{FOLDER}/DSPARK"] = {"dsv4_models": MODELS, "dsv4_model": FOLDER, "dsv4_speculative": "DSPARK"}
ALLOWED[f"{V0731}/DSPARK-block7"] = {"dsv4_model": V0731, "dsv4_speculative": "DSPARK",
                                     "dsv4_speculative_dspark_block_size": 7}
#: The FP4 index-K cache on top of every allowed choice: each combination of PD, speculative decoding
#: (DSPARK included) and FP4 serves the chat API the same way (docs/serving.md).
FP4 = {f"{name}+fp4": {**overrides, "dsv4_fp4_indexer": True} for name, overrides in ALLOWED.items()}
#: What the toolkit refuses, and the reason SGLang gives for the same units.
REFUSED = {
    f"{ORIGINAL}/DSPARK": ({"dsv4_model": ORIGINAL, "dsv4_speculative": "DSPARK"}, speculative.SGLANG_DSPARK_NEEDS_DRAFT),
    f"{V0731}/DSPARK-block0": ({"dsv4_model": V0731, "dsv4_speculative": "DSPARK", "dsv4_speculative_dspark_block_size": 0},
                               speculative.SGLANG_DSPARK_BLOCK_POSITIVE),
    f"{V0731}/NGRAM": ({"dsv4_model": V0731, "dsv4_speculative": "NGRAM"}, speculative.SGLANG_ONLY_EAGLE_DSPARK),
}


def v4_flash_config(drafter: bool) -> dict:
    """DeepSeek-V4-Flash's config.json as far as SGLang's argument pipeline reads it (the shapes of
    docs/sglang-contract.md); the drafter's is the same architecture, one layer, with its block."""
    ratios = [0, 0] + [4 if layer % 2 == 0 else 128 for layer in range(2, 43)]
    config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 129280,
              "hidden_size": 4096, "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
              "head_dim": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 448, "v_head_dim": 512,
              "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8, "kv_lora_rank": 512, "sliding_window": 128,
              "window_size": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
              "compress_ratios": ratios, "max_position_embeddings": 1048576, "n_routed_experts": 256,
              "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "intermediate_size": 2048,
              "n_shared_experts": 1, "torch_dtype": "bfloat16", "rope_theta": 10000, "rms_norm_eps": 1e-6,
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                      "activation_scheme": "dynamic"}}
    if drafter:
        config.update(architectures=["DeepseekV4ForCausalLMDSpark"], num_hidden_layers=1, compress_ratios=[0],
                      dspark_config={"block_size": 3})
    return config


def bundled_config() -> dict:
    """DeepSeek-V4-Flash-0731's config.json: the same model, its DSpark stages' keys beside it (the
    keys SGLang 0.5.23 recognises a bundled drafter by; three more compressed-attention layers)."""
    config = v4_flash_config(False)
    config.update(compress_ratios=config["compress_ratios"] + [4, 4, 4], dspark_block_size=5,
                  dspark_target_layer_ids=[40, 41, 42], dspark_markov_rank=256, dspark_noise_token_id=128799)
    return config


def write_models(root: Path) -> Path:
    for name, entry in MODELS.items():
        model = root / name
        model.mkdir(parents=True)
        bundled = entry["drafter"] == speculative.BUNDLED
        (model / "config.json").write_text(json.dumps(bundled_config() if bundled else v4_flash_config(False)))
        if entry["drafter"] and not bundled:
            (model / entry["drafter"]).mkdir()
            (model / entry["drafter"] / "config.json").write_text(json.dumps(v4_flash_config(True)))
    return root


def render_server_units(root: Path, combos: dict) -> dict:
    """{combo: {server: argv after `-m sglang.launch_server`}}: one ansible-playbook run that renders the
    role's server template with its defaults and the pins, each combination's choice on top (task vars)."""
    site_vars = yaml.safe_load((REPO / "playbooks/site.yml").read_text())[0]["vars"]
    template = str(ROLE / "templates/dsv4-server.service.j2")
    # debug runs on the controller (no module per file): each combination's units, registered.
    tasks = [{"ansible.builtin.debug": {"msg": "{{ lookup('ansible.builtin.template', '%s') }}" % template},
              "loop": "{{ sglang_service_servers }}", "vars": overrides, "register": f"combo{index}"}
             for index, overrides in enumerate(combos.values())]
    out = root / "units.json"
    tasks.append({"ansible.builtin.copy": {"dest": str(out), "mode": "0644", "content": "{{ %s | to_json }}" % (
        "[" + ", ".join(f"combo{index}.results | map(attribute='msg') | list" for index in range(len(combos))) + "]")}})
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars_files": [str(ROLE / "defaults/main.yml")],
             "vars": {**PINS, **site_vars, "dsv4_prefix": str(root / "box"), "dsv4_venv_dir": str(root / "box/venv"),
                      "dsv4_state_dir": str(root / "box/state"), "ansible_managed": "managed by dsv4kit",
                      "ansible_python_interpreter": sys.executable,
                      "dsv4_model_path": str(root / "models") + "/{{ dsv4_model }}"},
             "tasks": tasks}]
    (root / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(root / ".ansible-tmp")}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                           str(root / "render.yml")], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    argvs = {}
    for name, units in zip(combos, json.loads(out.read_text())):
        for server, text in zip(("prefill", "decode"), units):
            line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
            words = shlex.split(line.removeprefix("ExecStart="))
            argvs.setdefault(name, {})[server] = words[words.index("sglang.launch_server") + 1:]
    return argvs


def resolve(root: Path, cases: dict) -> dict:
    (root / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(sglang_site()), "SGLANG_DISABLE_REQUEST_LOGGING": "1"}
    done = subprocess.run([sys.executable, str(REPO / "tests/sglang_resolve_worker.py"), str(root / "cases.json")],
                          capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULTS "))


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculative")
    write_models(root / "models")
    combos = {**ALLOWED, **FP4, **{name: overrides for name, (overrides, _) in REFUSED.items()}}
    argvs = render_server_units(root, combos)
    results = resolve(root, {f"{name}|{server}": argv for name, servers in argvs.items()
                             for server, argv in servers.items()})
    return root, argvs, results


def inventory_values(overrides: dict) -> dict:
    """The inventory's values as Ansible templates them (the derived model fields)."""
    values = {**PINS, **overrides}
    entry = values["dsv4_models"][values["dsv4_model"]]
    return {**values, "dsv4_model_repo": entry["repo"], "dsv4_model_revision": entry["revision"],
            "dsv4_model_drafter": entry["drafter"]}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_each_allowed_choice_is_what_sglang_resolves_on_both_servers(resolved, name):
    root, argvs, results = resolved
    values = inventory_values(ALLOWED[name])
    assert speculative.problem(values) is None
    algorithm = values["dsv4_speculative"]
    for server in ("prefill", "decode"):
        result = results[f"{name}|{server}"]
        assert result["ok"], (name, server, result, argvs[name][server])
        got = result["resolved"]
        assert got["disaggregation_mode"] == server and got["tp_size"] == 4 and got["page_size"] == 256, got
        if algorithm == "off":
            assert got["speculative_algorithm"] is None, got
            continue
        assert got["speculative_algorithm"] == algorithm and got["speculative_eagle_topk"] == 1, got
        # The verify width the kernels see per request (docs/sglang-contract.md): draft tokens + 1.
        assert got["speculative_num_draft_tokens"] == speculative.verify_tokens(values), got
        if algorithm == "DSPARK":
            assert got["speculative_num_steps"] == 1, got
            model = root / "models" / values["dsv4_model"]  # a bundled drafter is the checkpoint itself
            drafter = values["dsv4_model_drafter"]
            assert got["speculative_draft_model_path"] == str(model if drafter == speculative.BUNDLED
                                                              else model / drafter), got
        else:  # EAGLE drafts with the checkpoint's own MTP layer
            assert got["speculative_num_steps"] == values["dsv4_speculative_num_steps"], got
            assert got["speculative_draft_model_path"] == str(root / "models" / values["dsv4_model"]), got
    assert results[f"{name}|prefill"]["resolved"]["speculative_num_draft_tokens"] == \
        results[f"{name}|decode"]["resolved"]["speculative_num_draft_tokens"]


@pytest.mark.parametrize("name", sorted({**ALLOWED, **FP4}))
def test_every_combination_serves_the_chat_api_with_both_parsers_and_the_served_name(resolved, name):
    """SGLang itself resolves each unit to the DeepSeek-V4 parsers, the inventory's served name (the
    model's repository id by default) and no custom chat template, on prefill and decode alike; the
    FP4 variants resolve the FP4 cache on, the others off."""
    _, argvs, results = resolved
    values = inventory_values({**ALLOWED, **FP4}[name])
    for server in ("prefill", "decode"):
        result = results[f"{name}|{server}"]
        assert result["ok"], (name, server, result, argvs[name][server])
        got = result["resolved"]
        assert (got["tool_call_parser"], got["reasoning_parser"]) == ("deepseekv4", "deepseek-v4"), got
        assert got["served_model_name"] == values["dsv4_model_repo"], got
        assert got["chat_template"] is None and "--chat-template" not in argvs[name][server], got
        assert got["enable_deepseek_v4_fp4_indexer"] is bool(values.get("dsv4_fp4_indexer")), got
        assert got["disaggregation_mode"] == server, got
        if name.endswith("+fp4"):  # the same speculative resolution as without the FP4 cache
            plain = results[f"{name.removesuffix('+fp4')}|{server}"]["resolved"]
            assert {k: v for k, v in got.items() if k != "enable_deepseek_v4_fp4_indexer"} == \
                {k: v for k, v in plain.items() if k != "enable_deepseek_v4_fp4_indexer"}, (got, plain)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refused_choice_is_refused_by_sglang_for_the_reason_the_toolkit_gives(resolved, name):
    _, argvs, results = resolved
    overrides, reason = REFUSED[name]
    found = speculative.problem(inventory_values(overrides))
    assert found and reason in found[1], found
    for server in ("prefill", "decode"):
        result = results[f"{name}|{server}"]
        assert not result["ok"] and reason in result["error"], (name, server, result, argvs[name][server])


def test_a_refused_choice_stops_the_inventory_load_naming_where_it_is_set(tmp_path):
    """At input: every command loads the inventory through dsv4kit.core.inventory, which refuses it."""
    from dsv4kit.core.inventory import InventoryError, load_inventory

    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/all.yml").write_text(yaml.safe_dump({**PINS, "dsv4_speculative": "DSPARK"}))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": {"box1": {}}}}}}))
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path / "hosts.yml")
    message = str(caught.value)
    assert "all.yml" in message and "host 'box1': dsv4_speculative is DSPARK but dsv4_model 'DeepSeek-V4-Flash' " \
        "ships no DSpark drafter" in message and speculative.SGLANG_DSPARK_NEEDS_DRAFT in message, message
    chosen = {**PINS, "dsv4_speculative": "DSPARK", "dsv4_model": V0731}
    (tmp_path / "group_vars/all.yml").write_text(yaml.safe_dump(chosen))
    host = load_inventory(tmp_path / "hosts.yml").host("box1")
    assert (host["dsv4_model_repo"], host["dsv4_model_drafter"], host["dsv4_model_path"]) == \
        ("deepseek-ai/DeepSeek-V4-Flash-0731", "bundled", "/models/DeepSeek-V4-Flash-0731")


@pytest.mark.parametrize("overrides,message", [
    ({"dsv4_model": "DeepSeek-V4-Flash-0801"}, "dsv4_model 'DeepSeek-V4-Flash-0801' is not one of dsv4_models"),
    ({"dsv4_speculative": "EAGLE", "dsv4_speculative_num_steps": 0}, "dsv4_speculative_num_steps (EAGLE draft steps) "
                                                                     "must be a whole number >= 1, got 0"),
    ({"dsv4_speculative_min_acceptance": 0.5}, "dsv4_speculative_min_acceptance must be >= 1"),
    ({"dsv4_speculative": "dspark"}, "dsv4_speculative must be one of off, EAGLE, DSPARK, got 'dspark'"),
])
def test_dsv4kits_own_rules_name_the_field(overrides, message):
    found = speculative.problem(inventory_values({k: v for k, v in overrides.items() if k != "dsv4_model"})
                                | ({"dsv4_model": overrides["dsv4_model"]} if "dsv4_model" in overrides else {}))
    assert found and message in found[1], found


def test_eagle_on_a_bundled_dspark_checkpoint_is_refused_by_dsv4kit():
    """SGLang accepts it, and it drafts nothing: the checkpoint's mtp.* weights are the DSpark stages."""
    found = speculative.problem(inventory_values({"dsv4_model": V0731, "dsv4_speculative": "EAGLE"}))
    assert found and found[0] == "dsv4_speculative" and "bundles a DSpark drafter" in found[1], found
    assert "use DSPARK, or off" in found[1]
