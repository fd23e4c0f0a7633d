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
    assert acceptance.check(None, host, lambda _l: None) is None


def test_the_probe_runs_in_the_serving_session_with_the_key_the_box_holds(tmp_path, loopback_ssh):
    """Over the loopback sshd, against a stand-in that wants the router's key: the check finds the
    ports, the venv and the key through ``ServingSession`` (the key read on the box from the role's
    file); without that file the server refuses, and the check says so, inconclusive."""
    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.core.ssh import open_session
    from dsv4kit.core.box_paths import ROUTER_KEY_FILE
    from tests.bench_support import FakeServer
    from tests.remote_inventory import write_inventory

    secret = tmp_path / "prefix" / ROUTER_KEY_FILE.lstrip("/")
    secret.parent.mkdir(parents=True)
    secret.write_text("DSV4_ROUTER_API_KEY=sk-acceptance-1\n")
    secret.chmod(0o600)
    server = FakeServer(tmp_path / "server", tmp_path, spec_accept_length=2.5, api_key_file=str(secret)).start()
    try:
        results = []
        for prefix in (tmp_path / "prefix", tmp_path / "no-key"):
            inventory = write_inventory(tmp_path / f"inv-{prefix.name}", loopback_ssh, dsv4_speculative="EAGLE",
                                        dsv4_speculative_num_steps=3,
                                        dsv4_router_port=server.port, dsv4_decode_port=server.port,
                                        dsv4_prefix=str(prefix))
            host = load_inventory(inventory).host()
            with open_session(host) as session:
                results.append(acceptance.check(session, host, lambda _l: None))
    finally:
        server.stop()
    served, refused = results
    assert served["passed"] is True and served["acceptance_length"] == 2.5, served
    assert refused["passed"] is None and "401" in refused["message"], refused
