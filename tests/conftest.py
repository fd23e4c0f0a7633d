import pytest

from tests.sshd import LoopbackSSHD


@pytest.fixture(scope="session")
def loopback_ssh(tmp_path_factory):
    """A real sshd on 127.0.0.1 (session-wide). See tests/sshd.py."""
    server = LoopbackSSHD(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()
