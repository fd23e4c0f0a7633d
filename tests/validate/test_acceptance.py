"""The acceptance check of `validate --gpu` (dsv4kit.validate.acceptance) on what SGLang 0.5.23's
/server_info says: internal_states[i].avg_spec_accept_length, per DP rank (the journey with a
running box: tests/journey/test_dspark_journey.py)."""

from __future__ import annotations

from types import SimpleNamespace

from dsv4kit.core import exitcodes
from dsv4kit.validate import acceptance


def info(*lengths, algorithm="DSPARK") -> dict:
    return {"server_info": {"speculative_algorithm": algorithm,
                            "internal_states": [{"avg_spec_accept_length": x} for x in lengths]}, "generated": 2}


def test_the_mean_over_ranks_is_read_and_judged_against_the_minimum():
    assert acceptance.read_acceptance(info(3.0, 2.0)["server_info"]) == 2.5
    assert acceptance.judge("DSPARK", 1.3, info(2.9))["passed"] is True
    failed = acceptance.judge("DSPARK", 1.3, info(1.02, 1.0))
    assert failed["passed"] is False and "1.01 tokens per verify step" in failed["message"], failed


def test_no_verify_step_yet_or_no_server_is_inconclusive_never_failed():
    for probe in (info(None), {"error": "URLError: connection refused"}):
        result = acceptance.judge("EAGLE", 1.3, probe if "error" in probe else {**probe, "server_info": {
            **probe["server_info"], "speculative_algorithm": "EAGLE"}})
        assert result["passed"] is None, result
        assert acceptance.exit_code(exitcodes.OK, result, lambda _l: None) == exitcodes.OK


def test_a_server_without_the_configured_drafter_fails():
    result = acceptance.judge("DSPARK", 1.3, info(algorithm=None))
    assert result["passed"] is False and "runs None" in result["message"], result


def test_no_drafter_configured_asks_the_box_nothing():
    host = SimpleNamespace(get=lambda name, default=None: {"dsv4_speculative": "off"}.get(name, default))
    assert acceptance.check(None, host, "/venv/bin/python", lambda _l: None) is None
