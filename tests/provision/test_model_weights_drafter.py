"""The weights script with a drafter, run directly against the stand-in hub (tests/fake_hf_hub.py) with
this environment's huggingface_hub. Bundled in the checkpoint (DeepSeek-V4-Flash-0731): its
config.json must carry the dspark_* keys, checked once on disk and again from the marker. In a
folder of the revision (SGLang's other convention): its files are downloaded and verified with the
rest and counted; a revision without it is refused, before any download and again from the marker."""

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


@pytest.mark.parametrize("hub", ["bundled"], indirect=True)
def test_a_bundled_drafter_is_checked_in_the_checkpoints_config(hub, tmp_path):
    code, report = weights(hub, tmp_path / "m", "--check", "--drafter", "bundled")
    assert code == 0 and report["drafter"] == {"bundled": True, "checked": False}, report  # nothing on disk yet
    code, report = weights(hub, tmp_path / "m", "--drafter", "bundled")
    assert code == 0 and report["status"] == "downloaded", report
    assert report["drafter"] == {"bundled": True, "checked": True, "block_size": 5,
                                 "keys": ["dspark_block_size", "dspark_target_layer_ids"]}, report
    code, again = weights(hub, tmp_path / "m", "--drafter", "bundled")  # from the marker, no download
    assert code == 0 and again["status"] == "verified" and again["drafter"] == report["drafter"], again


@pytest.mark.parametrize("hub", [""], indirect=True)
def test_a_checkpoint_without_the_dspark_keys_is_refused_as_bundled(hub, tmp_path):
    code, report = weights(hub, tmp_path / "m", "--drafter", "bundled")
    assert code == 1 and report["status"] == "refused", report
    assert "bundles no DSpark drafter: its config.json has none of dspark_block_size" in report["message"], report
    code, again = weights(hub, tmp_path / "m", "--drafter", "bundled")
    assert code == 1 and "bundles no DSpark drafter" in again["message"], again
