"""The weights script with a drafter (DeepSeek-V4-Flash-0731's DSpark draft model in a folder of the
revision), run directly against the stand-in hub (tests/fake_hf_hub.py) with this environment's
huggingface_hub: the drafter's files are downloaded and verified with the rest and counted in the
report; a revision without the drafter is refused, before any download and again from the marker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_hf_hub import FakeHub, tiny_repo

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_dsv4kitDrafterToken71"
SCRIPT = REPO / "playbooks/roles/model_weights/files/model_weights.py"


def weights(hub: FakeHub, dest: Path, *extra: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--repo", hub.repo.repo_id, "--revision", hub.repo.commit,
                           "--dest", str(dest), "--endpoint", hub.url, "--workers", "2", "--token-stdin", *extra],
                          input=TOKEN + "\n", capture_output=True, text=True, timeout=120, env={"HF_HUB_DISABLE_TELEMETRY": "1",
                                                                            "HF_HOME": str(dest) + ".hf",
                                                                            "PATH": "/usr/bin:/bin"})
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def hub(request):
    server = FakeHub(tiny_repo(drafter=request.param), token=TOKEN).start()
    yield server
    server.stop()


@pytest.mark.parametrize("hub", ["dspark"], indirect=True)
def test_the_drafter_is_fetched_verified_and_counted(hub, tmp_path):
    code, report = weights(hub, tmp_path / "m", "--drafter", "dspark")
    assert code == 0 and report["status"] == "downloaded", report
    assert report["drafter"] == {"folder": "dspark/", "files": 2, "bytes": 48_000 + len(
        hub.repo.files["dspark/config.json"])}, report
    assert (tmp_path / "m/dspark/model.safetensors").stat().st_size == 48_000
    code, again = weights(hub, tmp_path / "m", "--drafter", "dspark")  # from the marker, no download
    assert code == 0 and again["status"] == "verified" and again["drafter"] == report["drafter"], again


@pytest.mark.parametrize("hub", [""], indirect=True)
def test_a_revision_without_the_drafter_is_refused_by_name(hub, tmp_path):
    code, report = weights(hub, tmp_path / "m", "--check", "--drafter", "dspark")
    assert code == 1 and report["status"] == "refused", report
    assert "ships no DSpark drafter in dspark/ (no config.json and no .safetensors file" in report["message"], report
    assert not (tmp_path / "m").exists()
    code, plain = weights(hub, tmp_path / "m")  # fetched without a drafter, then asked for one
    assert code == 0 and plain["drafter"] is None, plain
    code, report = weights(hub, tmp_path / "m", "--drafter", "dspark")
    assert code == 1 and "ships no DSpark drafter" in report["message"], report
