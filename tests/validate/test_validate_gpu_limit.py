"""``dsv4kit validate --gpu N`` with N outside the inventory's GPUs is exit 2 before connecting.

The host's port is closed: a GPU the check lets through ends with exit 3 (the connection was
tried), so exit 2 naming the flag and the layout proves nothing was attempted."""

from __future__ import annotations

from tests.cli_support import cli
from dsv4kit.core import exitcodes
from tests.remote_inventory import closed_port, write_inventory


def validate(*args: str):
    code, _, err = cli("validate", *args)
    return code, err


def test_a_gpu_the_box_does_not_have_is_refused_before_connecting(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=closed_port(),
                                dsv4_prefill_gpus=[0, 1, 2, 3], dsv4_decode_gpus=[4, 5, 6, 7])
    results = tmp_path / "results"
    code, err = validate("--gpu", "8", "-i", str(inventory), "--installed", "--results-dir", str(results))
    assert code == exitcodes.USAGE, err
    assert "--gpu 8: host 'lo' has 8 GPU(s), 0-7 (prefill 0-3, decode 4-7)" in err
    assert f"dsv4_gpu_count of host 'lo' in {inventory}" in err
    assert "connect" not in err and "Traceback" not in err
    code, err = validate("--gpu", "7", "-i", str(inventory), "--installed", "--results-dir", str(results))
    assert code == exitcodes.UNREACHABLE, err  # a GPU of the box: the run goes on to connect


def test_the_verdicts_shapes_are_held_to_the_inventorys_limits(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=closed_port(),
                                dsv4_max_running_requests=16, dsv4_model_max_context_length=65536)
    results = str(tmp_path / "results")
    code, err = validate("--gpu", "7", "-c", "1,64", "-i", str(inventory), "--installed", "--results-dir", results)
    assert code == exitcodes.USAGE and "--concurrency/-c 64 exceeds the servers' max_running_requests 16" in err, err
    code, err = validate("--gpu", "7", "--ctx", "131072", "-i", str(inventory), "--installed", "--results-dir", results)
    assert code == exitcodes.USAGE and "--ctx 131072 exceeds the model's maximum context length 65536" in err, err
