"""The quickstart's other model choice on one simulated box (tests/journey/simulated_box.py):
DeepSeek-V4-Flash-0731 with DSpark speculative decoding, as docs/quickstart.md's "Which model"
sets it. The units as the role renders them carry the DSPARK setting to both PD servers, SGLang
0.5.23's own parser accepts them, the role's health waits pass (the served algorithm included), and
the acceptance check of `validate --gpu` (dsv4kit.validate.acceptance, run here as validate runs it:
over SSH, through the box's serving session) reads the acceptance length the decode server reports: a healthy drafter
passes, a drafter whose drafts are never accepted (acceptance 1.0) fails with that reason. A
`dsv4kit bench` point (SGLang's own client in the box's venv, through the router) records that
acceptance length beside the forward passes per second the decode server counted.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_support import invoke

from dsv4kit.core import exitcodes, speculative, wheelbuild
from dsv4kit.validate import acceptance
from tests.bench.test_bench_sweep import dsv4kit
from tests.bench_support import make_tokenizer
from tests.journey import launch_server_standin
from tests.journey.simulated_box import REPO, SimulatedBox
from tests.remote_inventory import write_inventory

pytestmark = pytest.mark.slow

CHOICE = {"dsv4_model": "DeepSeek-V4-Flash-0731", "dsv4_speculative": "DSPARK"}
PINS = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
REVISION = PINS["dsv4_models"][CHOICE["dsv4_model"]]["revision"]
BLOCK = PINS["dsv4_speculative_dspark_block_size"]  # verify steps of BLOCK + 1 rows a request


def write_weights_marker(model: Path) -> None:
    """The model_weights stage's marker, written by its own script's function, naming the 0731 revision."""
    spec = importlib.util.spec_from_file_location(
        "model_weights", REPO / "playbooks/roles/model_weights/files/model_weights.py")
    weights = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weights)
    files = {name: {"size": (model / name).stat().st_size, "sha256": weights.sha256(str(model / name))}
             for name in weights.local_files(str(model))}
    weights.write_marker(str(model), PINS["dsv4_models"][CHOICE["dsv4_model"]]["repo"], REVISION, files)


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    box = SimulatedBox(tmp_path_factory.mktemp("dspark"), {
        **CHOICE, "dsv4_kernel_flags": {"SGLANG_SM120_TRITON_INDEXER": "0", "SGLANG_SM120_MMA_ATTENTION": "0"}}).build()
    make_tokenizer(Path(sys.executable), box.model)  # the bench client reads it from the model directory
    # 0731 bundles its drafter: the checkpoint's config.json carries the dspark_* keys.
    (box.model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"],
                                                       "model_type": "dsv4kit-test", "vocab_size": 201,
                                                       "dspark_block_size": BLOCK, "dspark_target_layer_ids": [0]}))
    write_weights_marker(box.model)
    box.start_all()
    yield box
    box.stop_all()


def box_inventory(box, sshd, directory: Path, **extra) -> Path:
    """The box as an inventory host over the loopback sshd: the DSPARK choice and the box's ports."""
    ports = {k: box.vars[k] for k in ("dsv4_router_port", "dsv4_decode_port", "dsv4_prefill_port")}
    return write_inventory(directory, sshd, dsv4_speculative="DSPARK", dsv4_model_drafter="bundled",
                           dsv4_speculative_dspark_block_size=BLOCK, **ports, **extra)


def probe_and_judge(box, sshd, directory: Path) -> dict:
    """The acceptance check of `validate --gpu` as it runs: over SSH into the box, through its serving
    session (the ports, the venv and the key file under the box's prefix)."""
    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.core.ssh import open_session

    host = load_inventory(box_inventory(box, sshd, directory, dsv4_prefix=str(box.prefix))).host()
    with open_session(host) as session:
        return acceptance.check(session, host, lambda _line: None)


def test_dspark_units_start_healthy_and_report_their_acceptance(box, loopback_ssh, tmp_path):
    assert speculative.verify_tokens({**CHOICE, "dsv4_speculative_dspark_block_size": BLOCK}) == BLOCK + 1
    for name in ("dsv4-prefill.service", "dsv4-decode.service"):
        text = (box.units / name).read_text()
        line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
        argv = shlex.split(line.removeprefix("ExecStart="))
        at = argv.index("--speculative-algorithm")
        # The bundled drafter's path is the checkpoint's own.
        assert argv[at:at + 6] == ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", str(BLOCK),
                                   "--speculative-draft-model-path", str(box.model)], argv
    for argv in box.server_waits():
        code, result = box.wait(argv + ["--expect", "speculative_algorithm=DSPARK"])
        assert code == 0, result
    code, result = box.wait(box.router_wait())
    assert code == 0, result

    verdict = probe_and_judge(box, loopback_ssh, tmp_path / "inv")
    assert verdict["passed"] is True, verdict
    assert verdict["acceptance_length"] == pytest.approx(launch_server_standin.HEALTHY_ACCEPT_LENGTH)
    assert acceptance.exit_code(exitcodes.OK, verdict, lambda _line: None) == exitcodes.OK


def test_a_bench_point_records_the_acceptance_beside_the_forward_passes(box, loopback_ssh, box_dcgm, tmp_path,
                                                                        monkeypatch):
    """One `dsv4kit bench` point at C=1 with the box's venv and units: valid, its acceptance length the
    decode server's, and its forward passes per second the decode rate over that acceptance length."""
    monkeypatch.setenv("DSV4KIT_SPILL_DIR", str(tmp_path / "spill"))
    inventory = box_inventory(box, loopback_ssh, tmp_path / "inv", dsv4_venv_dir=str(box.venv),
                              dsv4_prefix=str(box.prefix), dsv4_model=CHOICE["dsv4_model"],
                              dsv4_model_path=str(box.model), dsv4_model_revision=REVISION,
                              # the name the role's units serve it under (group_vars' default)
                              dsv4_served_model_name=PINS["dsv4_models"][CHOICE["dsv4_model"]]["repo"],
                              dsv4_context_length=PINS["dsv4_context_length"],
                              dsv4_prefill_gpus=PINS["dsv4_prefill_gpus"], dsv4_decode_gpus=PINS["dsv4_decode_gpus"],
                              monitoring_dcgm_exporter_port=box_dcgm.port)
    done = dsv4kit("bench", "--ctx", str(PINS["dsv4_context_length"]), "--concurrency", "1", "--repeat", "1",
                   "--input-len", "64", "--output-len", "512", "--num-prompts", "2", "--warmup-requests", "1",
                   "--metrics-interval", "0.02", "--no-restart", "-i", str(inventory),
                   "--results-repo", str(tmp_path / "results"), "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((tmp_path / "results" / json.loads(done.stdout)["record_path"]).read_text())
    (point,) = record["points"]
    assert point["validity"]["passed"], point["validity"]
    derived, accept = point["derived"], launch_server_standin.HEALTHY_ACCEPT_LENGTH
    assert derived["acceptance_length"] == pytest.approx(accept), derived
    assert derived["acceptance_length_source"].startswith("/metrics"), derived
    assert derived["forward_passes_per_s"] == pytest.approx(derived["decode_tok_s"] / accept, rel=0.05), derived
    assert record["model"]["name"] == CHOICE["dsv4_model"] and record["model"]["revision"] == REVISION
    assert "(weights manifest)" in point["validity"]["gates"]["served_model"]["detail"]
    assert record["server"]["resolved_args"]["speculative_algorithm"] == "DSPARK"
    launched = record["server"]["launch_args"]
    assert launched[launched.index("--speculative-algorithm") + 1] == "DSPARK", launched


def test_validate_gpu_fails_a_drafter_whose_drafts_are_never_accepted(box, loopback_ssh, tmp_path):
    """`dsv4kit validate --gpu` over SSH (the loopback sshd; the kernel table on the interpreter) with the
    box's ports: the kernels pass, the served acceptance of 1.0 fails the run with its reason."""
    config = json.loads((box.model / "config.json").read_text())
    (box.model / "config.json").write_text(json.dumps({**config, "dsv4kit_standin_accept_length": 1.0}))
    assert box.systemctl("restart", "dsv4-decode.service").returncode == 0
    code, result = box.wait(box.server_waits()[1] + ["--expect", "speculative_algorithm=DSPARK"])
    assert code == 0, result
    inventory = box_inventory(box, loopback_ssh, tmp_path / "inv")
    wheel = wheelbuild.build_wheel(tmp_path / "wheel").path
    result = invoke(["validate", "--gpu", "0", "-i", str(inventory), "--interpret", "--cases",
                     "indexer:1x2x100x16", "--wheel", str(wheel), "--results-dir",
                     str(tmp_path / "results")])
    out, err = result.stdout, result.stderr
    assert result.exit_code == exitcodes.CHECK_FAILED, out + err
    assert "VERDICT: PASS" in out  # the kernels are fine; the drafter is not
    assert "FAIL: the DSPARK drafter's acceptance length is 1.00 tokens per verify step" in err, err
    report = json.loads(next((tmp_path / "results").iterdir()).read_text())
    assert report["speculative"]["passed"] is False and report["speculative"]["acceptance_length"] == 1.0

