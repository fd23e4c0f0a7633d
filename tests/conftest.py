import os
import signal

import pytest

# A suite started in the background of a non-interactive shell (`cmd &`, as some CI runners start
# it) inherits SIGINT ignored, and an ignored signal stays ignored across exec: the Ctrl-C tests'
# children would never see their SIGINT. A handler (not an ignore) is reset to the default by exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# No GPU in the test process: kernels that run in it (the validation table of tests/rollout/test_kernel_plan.py)
# run on Triton's interpreter, which Triton reads when it and a kernel module are first imported, so
# it is set before any test module imports them. Ahead-of-time builds and other runs that must not
# interpret start subprocesses without it.
os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.sshd import LoopbackSSHD


@pytest.fixture(scope="session")
def loopback_ssh(tmp_path_factory):
    """A real sshd on 127.0.0.1 (session-wide). See tests/sshd.py."""
    server = LoopbackSSHD(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory nothing can be created in (root ignores modes, so /proc for root)."""
    import os

    if os.geteuid() == 0:
        from pathlib import Path

        return Path("/proc")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    return ro


@pytest.fixture(autouse=True)
def _own_validation_reports(tmp_path_factory, monkeypatch):
    """Every test keeps validation reports and records in places of its own (the product's defaults
    are in the user's home): a test that means a default unsets $DSV4KIT_RESULTS_DIR or
    $DSV4KIT_RESULTS_REPO itself."""
    monkeypatch.setenv("DSV4KIT_RESULTS_DIR", str(tmp_path_factory.mktemp("validation-reports")))
    monkeypatch.setenv("DSV4KIT_RESULTS_REPO", str(tmp_path_factory.mktemp("results-repo") / "results"))


# --------------------------------------------------------------- the chat stand-in (tests/chat_standin.py)
#: The name the chat stand-in serves under (the units' default: the model's repository id).
SERVED_MODEL = "deepseek-ai/DeepSeek-V4-Flash"


@pytest.fixture(scope="module")
def chat_server_factory(tmp_path_factory):
    """``start(name, **FakeServer options) -> server``: a stand-in SGLang server whose
    ``/v1/chat/completions`` is SGLang 0.5.23's DeepSeek-V4 chat path, serving ``SERVED_MODEL``;
    ``chat_faults(server, faults)`` plants the chat route's faults. Stopped with the module."""
    from tests.bench_support import FakeServer

    started = []

    def start(name: str, **options):
        root = tmp_path_factory.mktemp(name)
        options.setdefault("served_model_name", SERVED_MODEL)
        server = FakeServer(root / "server", root, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def chat_faults(server, faults=()) -> None:
    """Plant the chat route's faults (tests/chat_standin.py ``FAULTS``) on a running stand-in."""
    server.post("/_test/config", {"chat": {"faults": list(faults)}})


# --------------------------------------------------------------- the bench tests' box (tests/bench_support.py)
@pytest.fixture(scope="session")
def bench_venv():
    """The real ``sglang.benchmark.serving`` client's venv (built once, cached)."""
    from tests.bench_support import client_venv

    return client_venv()


@pytest.fixture(scope="session")
def tokenizer_dir(bench_venv, tmp_path_factory):
    """The model directory of the bench box: the tiny tokenizer over the stand-in server's words."""
    from tests.bench_support import make_tokenizer

    return make_tokenizer(bench_venv / "bin" / "python", tmp_path_factory.mktemp("model") / "DeepSeek-V4-Flash-test")


@pytest.fixture(scope="session")
def box_dcgm(tmp_path_factory):
    """The GPU telemetry of every bench and eval box: one DCGM exporter stand-in (8 GPUs, no fault)
    per worker. ``bench_box``'s inventories point at it; a test that builds its own bench inventory
    passes ``monitoring_dcgm_exporter_port=box_dcgm.port``. Never plant a fault here (use ``dcgm``)."""
    from tests.bench_support import DcgmStandin

    standin = DcgmStandin(tmp_path_factory.mktemp("box-dcgm"), lifetime_s=4 * 3600).start()
    yield standin
    standin.stop()


@pytest.fixture
def dcgm(tmp_path):
    """A DCGM exporter stand-in of this test's own, with 2 GPUs, for planting faults."""
    from tests.bench_support import DcgmStandin

    standin = DcgmStandin(tmp_path / "dcgm", gpus=2, lifetime_s=300).start()
    yield standin
    standin.stop()


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """tests/fake_nvidia_smi.py first on this process's PATH as ``nvidia-smi`` (2 GPUs; its
    ``FAKE_NVSMI_*`` variables plant faults). The loopback box's login PATH does not see it."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {os.path.join(os.path.dirname(__file__), 'fake_nvidia_smi.py')} \"$@\"\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
def bench_box(tmp_path, loopback_ssh, bench_venv, tokenizer_dir, box_dcgm, monkeypatch):
    """``make(**server_kw) -> (server, inventory)``: a stand-in server and a one-host inventory whose
    box is this machine over the loopback sshd. ``separate_prefill``: a second server on its own
    port (a PD layout); ``units``: the serving units the playbook writes, under a scratch prefix;
    ``inventory_context_length`` / ``inventory_extra``: inventory values; ``model``: another model
    directory (default: ``tokenizer_dir``). The box's GPU telemetry is ``box_dcgm`` unless
    ``inventory_extra`` names another exporter. Finished points spill to ``tmp_path/spill``
    (``$DSV4KIT_SPILL_DIR``)."""
    from tests.bench_support import FakeServer, bench_inventory, write_units

    servers = []
    monkeypatch.setenv("DSV4KIT_SPILL_DIR", str(tmp_path / "spill"))

    def make(separate_prefill: bool = False, units: bool = False, **server_kw):
        context_length = server_kw.pop("inventory_context_length", None)
        inventory_extra = {"monitoring_dcgm_exporter_port": box_dcgm.port, **server_kw.pop("inventory_extra", {})}
        model = server_kw.pop("model", None) or tokenizer_dir
        server = FakeServer(tmp_path / f"server{len(servers)}", model, **server_kw).start()
        servers.append(server)
        prefill_port = None
        if separate_prefill:
            prefill = FakeServer(tmp_path / f"server{len(servers)}", model, **server_kw).start()
            servers.append(prefill)
            prefill_port = prefill.port
            server.post("/_test/config", {"prefill_peer_port": prefill_port})  # the router's dual dispatch
        prefix = None
        if units:
            prefix = tmp_path / "prefix"
            write_units(prefix, bench_venv, server.port, prefill_port)
        inventory = bench_inventory(tmp_path / f"inv{len(servers)}", loopback_ssh, venv=bench_venv,
                                    model_path=model, port=server.port, prefill_port=prefill_port,
                                    context_length=context_length or server_kw.get("context_length", 4096),
                                    prefix=prefix, **inventory_extra)
        return server, inventory

    yield make
    for server in servers:
        server.stop()


def pytest_collection_modifyitems(config, items):
    """The journeys (the longest files) first: with ``--dist loadfile`` the workers take files in
    collection order, and a journey taken last keeps one worker busy long after the other is done."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/journey/"))
