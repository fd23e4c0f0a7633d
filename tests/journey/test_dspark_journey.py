"""The quickstart's other model choice on one simulated box (tests/journey/simulated_box.py):
DeepSeek-V4-Flash-0731 with DSpark speculative decoding, as docs/quickstart.md's "Which model"
sets it. The units as the role renders them carry the DSPARK setting to both PD servers, SGLang
0.5.23's own parser accepts them, the role's health waits pass (the served algorithm included), and
the acceptance check of `validate --gpu` (dsv4kit.validate.acceptance, its box-side probe run here
against the box's ports) reads the acceptance length the decode server reports: a healthy drafter
passes, a drafter whose drafts are never accepted (acceptance 1.0) fails with that reason.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from typer.testing import CliRunner

from dsv4kit.cli import app
from dsv4kit.core import exitcodes, speculative, wheelbuild
from dsv4kit.validate import acceptance
from tests.journey import launch_server_standin
from tests.journey.simulated_box import SimulatedBox
from tests.remote_inventory import write_inventory

pytestmark = pytest.mark.slow

CHOICE = {"dsv4_model": "DeepSeek-V4-Flash-0731", "dsv4_speculative": "DSPARK"}


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    box = SimulatedBox(tmp_path_factory.mktemp("dspark"), {
        **CHOICE, "dsv4_kernel_flags": {"SGLANG_SM120_TRITON_INDEXER": "0", "SGLANG_SM120_MMA_ATTENTION": "0"}}).build()
    (box.model / "dspark").mkdir()
    (box.model / "dspark/config.json").write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLMDSpark"]}))
    box.start_all()
    yield box
    box.stop_all()


def probe(box) -> dict:
    """The box-side half of the acceptance check, run with the box's venv python on its ports."""
    done = subprocess.run([str(box.venv / "bin/python"), "-c", acceptance.BOX_SCRIPT,
                           f"http://127.0.0.1:{box.vars['dsv4_router_port']}",
                           f"http://127.0.0.1:{box.vars['dsv4_decode_port']}", "8", json.dumps(acceptance.PROMPTS)],
                          env=box.env, capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dspark_units_start_healthy_and_report_their_acceptance(box):
    block = 3  # the inventory's dsv4_speculative_dspark_block_size: verify steps of block + 1 rows a request
    assert speculative.verify_tokens({**CHOICE, "dsv4_speculative_dspark_block_size": block}) == block + 1
    for name in ("dsv4-prefill.service", "dsv4-decode.service"):
        text = (box.units / name).read_text()
        assert (f"--speculative-algorithm DSPARK --speculative-dspark-block-size {block} "
                f"--speculative-draft-model-path {box.model}/dspark") in text, text
    for argv in box.server_waits():
        code, result = box.wait(argv + ["--expect", "speculative_algorithm=DSPARK"])
        assert code == 0, result
    code, result = box.wait(box.router_wait())
    assert code == 0, result

    verdict = acceptance.judge("DSPARK", 1.3, probe(box))
    assert verdict["passed"] is True, verdict
    assert verdict["acceptance_length"] == pytest.approx(launch_server_standin.HEALTHY_ACCEPT_LENGTH)
    assert acceptance.exit_code(exitcodes.OK, verdict, lambda _line: None) == exitcodes.OK


def test_validate_gpu_fails_a_drafter_whose_drafts_are_never_accepted(box, loopback_ssh, tmp_path):
    """`dsv4kit validate --gpu` over SSH (the loopback sshd; the kernel table on the interpreter) with the
    box's ports: the kernels pass, the served acceptance of 1.0 fails the run with its reason."""
    (box.model / "dspark/config.json").write_text(json.dumps({"dsv4kit_standin_accept_length": 1.0}))
    assert box.systemctl("restart", "dsv4-decode.service").returncode == 0
    code, result = box.wait(box.server_waits()[1] + ["--expect", "speculative_algorithm=DSPARK"])
    assert code == 0, result
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_speculative="DSPARK", dsv4_model_drafter="dspark",
                                dsv4_speculative_dspark_block_size=3,
                                dsv4_router_port=box.vars["dsv4_router_port"],
                                dsv4_decode_port=box.vars["dsv4_decode_port"])
    wheel = wheelbuild.build_wheel(tmp_path / "wheel").path
    result = CliRunner().invoke(app, ["validate", "--gpu", "0", "-i", str(inventory), "--interpret", "--cases",
                                      "indexer:1x2x100x16", "--wheel", str(wheel), "--results-dir",
                                      str(tmp_path / "results")])
    out, err = result.stdout, result.stderr
    assert result.exit_code == exitcodes.CHECK_FAILED, out + err
    assert "VERDICT: PASS" in out  # the kernels are fine; the drafter is not
    assert "FAIL: the DSPARK drafter's acceptance length is 1.00 tokens per verify step" in err, err
    report = json.loads(next((tmp_path / "results").iterdir()).read_text())
    assert report["speculative"]["passed"] is False and report["speculative"]["acceptance_length"] == 1.0

