import subprocess


def test_loopback_sshd_accepts_the_client_key(loopback_ssh):
    out = subprocess.run(loopback_ssh.ssh_argv("echo", "hello"), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello"
