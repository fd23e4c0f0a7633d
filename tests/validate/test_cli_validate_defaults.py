"""``dsv4kit validate`` on a box: the inventory's ``dsv4_validate_gpu`` when ``--gpu`` is not given, and
``--results-dir``/``--output`` checked before anything is built or connected to.

The "box" is this machine over the loopback sshd (tests/remote_inventory.py); the harness runs one
tiny case through the Triton interpreter, with the dsv4kit installed here (``--installed``).
"""

from __future__ import annotations

import json
import re


from dsv4kit.core import exitcodes

from dsv4kit.validate import remote as remote_validate
from tests.remote_inventory import closed_port, write_inventory
from tests.cli_support import cli

CASE = "indexer:1x2x100x16"


def validate(*args: str):
    return cli("validate", *args)


def test_host_without_gpu_uses_its_dsv4_validate_gpu(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_validate_gpu=2)
    results = tmp_path / "results"
    code, out, err = validate("--host", "lo", "-i", str(inventory), "--interpret", "--cases", CASE, "--installed",
                              "--results-dir", str(results))
    assert code == exitcodes.OK, out + err
    assert "GPU 2: dsv4_validate_gpu of lo" in err
    assert "validation table: lo GPU 2" in out
    kept = list(results.iterdir())
    assert len(kept) == 1 and re.fullmatch(r"lo-gpu2-\d{8}T\d{6}Z\.json", kept[0].name), kept
    assert json.loads(kept[0].read_text())["remote"]["gpu"] == 2


def test_no_gpu_anywhere_is_a_usage_error_before_connecting(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=closed_port())
    code, _, err = validate("--host", "lo", "-i", str(inventory), "--installed")
    assert code == exitcodes.USAGE, err
    assert "no GPU to validate on: pass --gpu N, or set dsv4_validate_gpu for host 'lo'" in err
    code, _, err = validate("--interpret")  # no --local, --gpu or --host (bare `validate` prints the help)
    assert code == exitcodes.USAGE and "give --local, --gpu N, or --host NAME" in err


def test_unwritable_report_paths_fail_before_building_or_connecting(tmp_path, loopback_ssh, unwritable_dir):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=closed_port())  # would be exit 3
    (tmp_path / "a-file").write_text("x")
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--results-dir", str(tmp_path / "a-file" / "r"))
    assert code == exitcodes.USAGE, err
    assert "--results-dir" in err and "cannot be created" in err and "building" not in err
    results = tmp_path / "results"
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--results-dir", str(results),
                            "--output", str(unwritable_dir / "sub" / "copy.json"))
    assert code == exitcodes.USAGE, err
    assert "--output" in err and "building" not in err
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--results-dir", str(results),
                            "-o", str(tmp_path))
    assert code == exitcodes.USAGE and "is a directory" in err
    assert not any(results.iterdir())  # created, and left empty


def test_a_report_that_cannot_be_written_is_a_clear_error(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh)
    (tmp_path / "a-file").write_text("x")
    lines = []
    output = remote_validate.Output(out=lines.append, err=lines.append)
    run = remote_validate._Run(output, gpu=0, host_name=None, inventory=inventory, timeout=60.0, cases=None,
                               json_path=None, interpret=True, installed=True, trust_new_host_key=False,
                               results_dir=tmp_path / "a-file" / "results", wheel=None, test_sleep=None)
    run._load_host()
    try:
        run._keep({"passed": True, "suites": {}, "environment": {}})
    except remote_validate.ValidationAbort as exc:
        assert exc.exit_code == exitcodes.ENVIRONMENT
        assert "the report could not be written to" in str(exc) and "no report was kept" in str(exc)
    else:
        raise AssertionError("writing under a file must fail")
    # --output that cannot be written: the kept report stays, a failed case still exits 1.
    run.results_dir = tmp_path / "results"
    run.json_path = tmp_path / "a-file" / "copy.json"
    assert run._keep({"passed": True, "suites": {}, "environment": {}}) == exitcodes.ENVIRONMENT
    assert run._keep({"passed": False, "suites": {}, "environment": {}}) == exitcodes.CHECK_FAILED
    assert any("could not be written to --output" in line for line in lines)
    assert len(list(run.results_dir.iterdir())) == 2
