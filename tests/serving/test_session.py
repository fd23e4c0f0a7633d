"""The serving session's own contract: the box's addresses, the key's environment, the restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4kit.core import exitcodes
from dsv4kit.core.inventory import Host
from dsv4kit.serving.abort import ServingAbort
from dsv4kit.serving.session import Addresses, ServingSession, api_env


def host(**values) -> Host:
    return Host(name="box1", groups=[], source=Path("hosts.yml"),
                vars={"dsv4_decode_port": 30001, "dsv4_model_path": "/models/m", "dsv4_venv_dir": "/opt/venv",
                      **values})


@pytest.mark.parametrize("values, router, prefill, serving", [
    ({"dsv4_router_port": 30000, "dsv4_prefill_port": 30002}, 30000, 30002, [30000, 30001, 30002]),
    ({}, 30001, None, [30001]),                                        # no router: the decode server
    ({"dsv4_router_port": 30000, "dsv4_prefill_port": 30001}, 30000, None, [30000, 30001]),  # one server
])
def test_the_addresses_come_from_the_inventory(values, router, prefill, serving):
    addresses = Addresses.of(host(**values))
    assert (addresses.router_port, addresses.prefill_port, addresses.serving_ports) == (router, prefill, serving)
    assert addresses.router_url == f"http://127.0.0.1:{router}"
    assert addresses.server_ports == [30001] + ([prefill] if prefill else [])


def test_the_box_side_steps_get_the_key_file_path_never_a_key(monkeypatch):
    monkeypatch.setenv("DSV4KIT_API_KEY", "sk-test")  # the old control-side variable is not read
    assert api_env(host()) == {"DSV4KIT_API_KEY_FILE": "/etc/dsv4kit/router-secret.env"}
    assert api_env(host(dsv4_prefix="/srv/b")) == {"DSV4KIT_API_KEY_FILE": "/srv/b/etc/dsv4kit/router-secret.env"}
    moved = host(dsv4_prefix="/srv/b", sglang_service_router_secret_file="/etc/keys/router.env")
    assert api_env(moved) == {"DSV4KIT_API_KEY_FILE": "/etc/keys/router.env"}  # where the role wrote it


def test_the_box_reads_the_key_file_itself_and_no_file_means_no_key(tmp_path, monkeypatch):
    from dsv4kit.serving.box import http, key

    secret = tmp_path / "router-secret.env"
    monkeypatch.setenv(key.KEY_FILE_VARIABLE, str(secret))
    key.api_key.cache_clear()
    assert http.headers() == {}
    secret.write_text("# written by the role\nDSV4_ROUTER_API_KEY=sk-file\n")
    key.api_key.cache_clear()
    assert http.headers() == {"Authorization": "Bearer sk-file"}
    secret.write_text("OTHER=1\n")
    with pytest.raises(key.KeyFileError, match="no DSV4_ROUTER_API_KEY= line"):
        key.read_key_file(str(secret))
    key.api_key.cache_clear()


class Box(ServingSession):
    """The session with its box-side steps answered here: a decode server at ``ctx``."""

    def __init__(self, h, ctx):
        super().__init__(None, h, lambda line: None, "/inv")
        self.ctx, self.calls = ctx, []

    def server_info(self, port, env):
        self.calls.append(("server_info", port))
        return {"context_length": self.ctx}

    def wait_health(self, ports, timeout, env):
        self.calls.append(("wait_health", tuple(ports)))

    def probe(self):
        self.calls.append(("probe",))
        return {"processes": [], "units": {}}


def test_ensure_context_restarts_waits_and_reads_back():
    box = Box(host(dsv4_router_port=30000, dsv4_prefill_port=30002), 8192)

    def restart(inventory, h, ctx, progress, timeout):
        box.calls.append(("restart", inventory, ctx))
        box.ctx = ctx

    assert box.ensure_context(8192, 60, restart=restart) is False
    assert box.ensure_context(16384, 60, restart=restart) is True
    assert ("restart", "/inv", 16384) in box.calls and ("wait_health", (30000, 30001, 30002)) in box.calls
    assert ("probe",) not in box.calls  # nothing 'auto' to pin: the probe is not read


def test_ensure_context_refuses_without_restart_and_names_a_restart_that_did_not_take():
    box = Box(host(), 8192)
    with pytest.raises(ServingAbort, match="--no-restart") as info:
        box.ensure_context(16384, 60, allow_restart=False)
    assert info.value.exit_code == exitcodes.ENVIRONMENT
    with pytest.raises(ServingAbort, match="still reports context length 8192, not 16384"):
        box.ensure_context(16384, 60, restart=lambda *a: None)


def test_an_auto_setting_is_pinned_from_the_probe_before_a_restart():
    box = Box(host(dsv4_fp4_indexer="auto"), 8192)
    with pytest.raises(ServingAbort, match="dsv4_fp4_indexer is 'auto'"):  # nothing runs to read it from
        box.ensure_context(16384, 60, restart=lambda *a: None)
    assert ("probe",) in box.calls
