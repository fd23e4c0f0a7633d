"""docs/overview.md: its sample charts come from docs/samples/make_samples.py as it is now and say
"synthetic"; its ports and GPUs are the shipped defaults; README links it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "docs" / "samples"
OVERVIEW = (ROOT / "docs" / "overview.md").read_text()


def png_text(path: Path) -> dict:
    with Image.open(path) as image:
        image.load()
        return dict(image.text)


def test_the_sample_charts_are_redrawn_by_the_script_and_labelled_synthetic(tmp_path):
    done = subprocess.run([sys.executable, str(SAMPLES / "make_samples.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    committed = sorted(p.name for p in SAMPLES.glob("*.png"))
    assert drawn == committed and len(drawn) == 3, (drawn, committed)
    for name in drawn:
        fresh, kept = png_text(tmp_path / name), png_text(SAMPLES / name)
        assert "synthetic" in name and "SYNTHETIC" in fresh["Description"], fresh
        # The committed image was drawn from the script's current inputs: rerun it after a change.
        assert kept.get("synthetic-digest") == fresh["synthetic-digest"], \
            f"docs/samples/{name} is stale: run `python docs/samples/make_samples.py`"
        assert f"(samples/{name})" in OVERVIEW, name
    captions = re.findall(r"^\*Synthetic: .*", OVERVIEW, re.MULTILINE)
    assert len(captions) == 3, captions


def test_the_pictures_ports_and_gpus_are_the_shipped_defaults():
    pins = yaml.safe_load((ROOT / "inventory/group_vars/all.yml").read_text())
    monitoring = yaml.safe_load((ROOT / "playbooks/roles/monitoring/defaults/main.yml").read_text())
    assert f"dsv4-router.service<br/>sglang-router, port {pins['dsv4_router_port']}" in OVERVIEW
    for unit, gpus, port in (("prefill", pins["dsv4_prefill_gpus"], pins["dsv4_prefill_port"]),
                             ("decode", pins["dsv4_decode_gpus"], pins["dsv4_decode_port"])):
        assert f"dsv4-{unit}.service<br/>SGLang, GPUs {gpus[0]}-{gpus[-1]}, port {port}" in OVERVIEW, unit
    assert f"bootstrap {pins['dsv4_disaggregation_bootstrap_port']}" in OVERVIEW
    assert f"validate --gpu {pins['dsv4_validate_gpu']}" in OVERVIEW
    for name, label in (("prometheus", "Prometheus"), ("alertmanager", "Alertmanager"), ("grafana", "Grafana"),
                        ("node_exporter", "node_exporter"), ("dcgm_exporter", "DCGM exporter")):
        assert f"{label} {monitoring[f'monitoring_{name}_port']}" in OVERVIEW, name


def test_readme_and_architecture_link_it():
    assert "](docs/overview.md)" in (ROOT / "README.md").read_text()
    assert "](overview.md)" in (ROOT / "docs/architecture.md").read_text()
