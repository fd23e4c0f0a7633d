import os

import pytest

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
    """Every test keeps validation reports in a directory of its own (the product's default is in
    the user's home): a test that means the default unsets $DSV4KIT_RESULTS_DIR itself."""
    monkeypatch.setenv("DSV4KIT_RESULTS_DIR", str(tmp_path_factory.mktemp("validation-reports")))
