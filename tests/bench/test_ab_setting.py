"""``--ab`` over an inventory setting of the serving units (``dsv4_fp4_indexer``), and the pins that
keep every other ``auto`` as the units run it when an arm or a context change restarts them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsv4kit.serving.pins import pin_running, running_fp4
from dsv4kit.serving.arms import arm_extra_vars, parse_ab
from dsv4kit.bench.config import BenchAbort
from dsv4kit.core import exitcodes

FP4 = "--enable-deepseek-v4-fp4-indexer"


def host(**values):
    base = {"dsv4_decode_port": 30002, "dsv4_prefill_port": 30001,
            "dsv4_kernel_flags": {"SGLANG_SM120_TRITON_INDEXER": "1"}, **values}
    return SimpleNamespace(name="box1", vars=base, get=lambda k, d=None, _v=base: _v.get(k, d))


def live(h):
    """A Host-like whose get() follows ``vars`` (pin_running replaces it)."""
    h.get = lambda k, d=None: h.vars.get(k, d)
    return h


def server(port: int, fp4: bool) -> dict:
    argv = ["/opt/dsv4/venv/bin/python", "-m", "sglang.launch_server", "--port", str(port)] + ([FP4] if fp4 else [])
    return {"pid": port, "argv": argv, "env": {}}


@pytest.mark.parametrize("text, values", [("dsv4_fp4_indexer=false,true", ("false", "true")),
                                          ("dsv4_fp4_indexer=1,0", ("true", "false")),
                                          ("dsv4_fp4_indexer= FALSE , True", ("false", "true"))])
def test_the_setting_takes_booleans_kept_as_true_false(text, values):
    ab = parse_ab(text)
    assert ab.kind == "setting" and (ab.values["A"], ab.values["B"]) == values
    assert ab.to_dict()["kind"] == "setting"


@pytest.mark.parametrize("text, words", [
    ("dsv4_fp4_indexr=false,true", "not an inventory setting an A/B can change; the settings it can: dsv4_fp4_indexer"),
    ("dsv4_fp4_indexer=off,on", "dsv4_fp4_indexer takes true or false (or 1/0)"),
    ("dsv4_fp4_indexer=true,1", "the two values are the same"),
    ("dsv4_fp4_indexer=true", "exactly two"),
])
def test_bad_setting_input_is_exit_2_naming_it(text, words):
    with pytest.raises(BenchAbort) as info:
        parse_ab(text)
    assert info.value.exit_code == exitcodes.USAGE and words in str(info.value)


def test_an_arm_of_the_setting_restarts_both_servers_with_it():
    ab = parse_ab("dsv4_fp4_indexer=false,true")
    h = host(dsv4_fp4_indexer="auto")
    assert arm_extra_vars(h, 131072, ab, "A") == (["sglang_service"], {"dsv4_context_length": 131072,
                                                                      "dsv4_fp4_indexer": False})
    assert arm_extra_vars(h, 131072, ab, "B")[1]["dsv4_fp4_indexer"] is True


def test_other_arms_pass_the_setting_the_host_holds_never_auto():
    ab = parse_ab("SGLANG_SM120_TRITON_INDEXER=0,1")
    assert arm_extra_vars(host(dsv4_fp4_indexer=True), 8192, ab, "A")[1]["dsv4_fp4_indexer"] is True
    assert "dsv4_fp4_indexer" not in arm_extra_vars(host(dsv4_fp4_indexer="auto"), 8192, ab, "A")[1]


@pytest.mark.parametrize("fp4", [True, False])
def test_an_auto_setting_is_pinned_to_what_the_servers_run(fp4):
    h = live(host(dsv4_fp4_indexer="auto"))
    probe = {"processes": [server(30001, fp4), server(30002, fp4)]}
    pin_running(h, probe, 8192, keep="SGLANG_SM120_TRITON_INDEXER")
    assert h.vars["dsv4_fp4_indexer"] is fp4
    tags, extra = arm_extra_vars(h, 8192, parse_ab("SGLANG_SM120_TRITON_INDEXER=0,1"), "A")
    assert extra["dsv4_fp4_indexer"] is fp4


def test_the_key_under_test_is_not_pinned_and_units_are_read_when_no_server_runs():
    h = live(host(dsv4_fp4_indexer="auto"))
    pin_running(h, {"processes": []}, 8192, keep="dsv4_fp4_indexer")
    assert h.vars["dsv4_fp4_indexer"] == "auto"
    units = {f"dsv4-{r}": {"exec_start": f"/opt/dsv4/venv/bin/python -m sglang.launch_server {FP4}"}
             for r in ("prefill", "decode")}
    assert running_fp4(h, {"processes": [], "units": units}) == (True, "the running servers' command lines")


@pytest.mark.parametrize("probe, words", [
    ({"processes": []}, "no running decode server"),
    ({"processes": [server(30001, True), server(30002, False)]}, "the servers differ"),
    ({"processes": [], "restart_pending": True, "units": {"dsv4-decode": {"exec_start": FP4},
                                                          "dsv4-prefill": {"exec_start": FP4}}}, "restart is pending"),
])
def test_an_auto_setting_that_cannot_be_read_stops_before_any_restart(probe, words):
    h = live(host(dsv4_fp4_indexer="auto"))
    with pytest.raises(BenchAbort) as info:
        pin_running(h, probe, 8192)
    assert info.value.exit_code == exitcodes.ENVIRONMENT and words in str(info.value)
    assert "dsv4kit provision" in str(info.value) and h.vars["dsv4_fp4_indexer"] == "auto"
