"""The version pins in inventory/group_vars/all.yml agree with what SGLang 0.5.23 itself requires."""

import re
import zipfile
from pathlib import Path

import yaml

from tests.sglang_wheel import sglang_wheel

ROOT = Path(__file__).resolve().parents[2]
PINS = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all.yml").read_text())


def _requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]


def test_sglang_pin_is_the_supported_version():
    from dsv4kit.rollout.targets import SUPPORTED_SGLANG_VERSIONS

    assert PINS["dsv4_sglang_version"] in SUPPORTED_SGLANG_VERSIONS


def test_torch_pin_matches_sglangs_own_requirement():
    requirements = _requirements(sglang_wheel())
    torch_pins = [r for r in requirements if re.match(r"torch\s*==", r)]
    assert torch_pins, "SGLang's wheel no longer pins torch exactly"
    assert torch_pins[0].split("==", 1)[1].split(";")[0].strip() == PINS["dsv4_torch_version"]


def test_triton_pin_is_the_series_torch_2_14_requires():
    # torch 2.14.1's own metadata: triton~=3.8.0 (Linux). Re-check when dsv4_torch_version moves.
    assert PINS["dsv4_torch_version"] == "2.14.1"
    assert PINS["dsv4_triton_version"].startswith("3.8.")


def test_flash_attn_build_requirements_are_pinned_in_the_venv_packages():
    # `pip wheel --no-build-isolation` of flash-attn imports these from the venv; sglang_venv
    # installs and verifies dsv4_venv_packages, so each must be pinned there exactly.
    defaults = yaml.safe_load((ROOT / "playbooks/roles/flash_attn/defaults/main.yml").read_text())
    requirements = defaults["flash_attn_build_requirements"]
    assert requirements, "flash_attn_build_requirements is empty"
    pinned = {}
    for spec in PINS["dsv4_venv_packages"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", spec)
        if match:
            pinned[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    missing = [name for name in requirements if re.sub(r"[-_.]+", "-", name).lower() not in pinned]
    assert not missing, f'pin each of {missing} as "name==version" in dsv4_venv_packages (inventory/group_vars/all.yml)'
