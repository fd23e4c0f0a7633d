"""Item: `dsv4kit profile` reads the traces a provisioned box writes. There the servers run as the
service user with ``UMask=0027`` (traces 0640, service user's) and the login user is not root.
The box-side script's own directory set-up is run as a non-root login user, a service user with
that umask writes a gzipped trace into it as SGLang's profiler does, and the login user reads,
recompresses and removes it. Needs root (to make the two users); skipped otherwise."""

import gzip
import os
import pwd
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dsv4kit.profile import box_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a login and a service user")


@pytest.fixture
def users():
    names = [f"d4l{uuid.uuid4().hex[:6]}", f"d4s{uuid.uuid4().hex[:6]}"]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name], check=True)
    try:
        yield names
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False)
            subprocess.run(["groupdel", name], check=False, capture_output=True)


#: The box-side script is standard library only: the system python runs it (this venv's may sit
#: under a home the test users cannot enter).
PYTHON = next((p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK)), sys.executable)


def as_user(name: str, code: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    entry = pwd.getpwnam(name)
    return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60, cwd="/",
                          user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], umask=umask,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(box_profile.__file__).parent)})


def test_the_login_user_reads_and_removes_the_service_users_0640_traces(tmp_path, users):
    login, service = users
    scratch = tmp_path / "scratch"  # as <dsv4_state_dir>/scratch/bench-XXXX: the login user's own
    scratch.mkdir()
    os.chown(scratch, pwd.getpwnam(login).pw_uid, pwd.getpwnam(login).pw_gid)
    os.chmod(scratch, 0o700)
    os.chmod(tmp_path, 0o755)
    for parent in tmp_path.parents:  # pytest's base is root-only: let the users through
        if parent != Path("/"):
            os.chmod(parent, os.stat(parent).st_mode | 0o011)
    out = scratch / "traces-4096"
    made = as_user(login, f"import box_profile; box_profile.prepare_out_dir({str(out)!r})")
    assert made.returncode == 0, made.stderr
    trace = out / "p1-TP-0.trace.json.gz"
    wrote = as_user(service, "import gzip; f = gzip.open(%r, 'wb'); f.write(b'{\"traceEvents\": []}'); f.close()"
                    % str(trace), umask=0o027)
    assert wrote.returncode == 0, wrote.stderr
    assert oct(trace.stat().st_mode & 0o777) == "0o640" and trace.stat().st_uid == pwd.getpwnam(service).pw_uid
    read = as_user(login, "import gzip, os, sys; data = gzip.open(sys.argv[1] if len(sys.argv) > 1 else %r).read(); "
                          "os.remove(%r); print(data.decode())" % (str(trace), str(trace)))
    assert read.returncode == 0, read.stderr  # before the fix: PermissionError
    assert '"traceEvents"' in read.stdout and not trace.exists()
