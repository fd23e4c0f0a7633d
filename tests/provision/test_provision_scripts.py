"""The box-side helper scripts of the sglang_service role, run for real: the health wait against a
local HTTP server answering like SGLang's /server_info, the unit verifier on good and broken
units, and the units' ExecStartPre preflight against a fake nvidia-smi. (On the GPU-less test box
the units are never started, so this is where these checks are exercised.)"""

import base64
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import pytest
import yaml

FILES = Path(__file__).resolve().parents[2] / "playbooks/roles/sglang_service/files"
TEMPLATES = FILES.parent / "templates"
SERVER_INFO = {"context_length": 131072, "cuda_graph_max_bs_decode": 64, "disaggregation_mode": "decode",
               "version": "0.5.23"}


@pytest.fixture
def server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(SERVER_INFO).encode() if self.path == "/server_info" else b"OK"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def wait(*args, env=None):
    return subprocess.run([sys.executable, str(FILES / "health_wait.py"), *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_health_wait_accepts_matching_server(server):
    env = dict(os.environ, SGLANG_SM120_TRITON_INDEXER="1")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        result = wait("--url", server, "--timeout", "10", "--expect", "context_length=131072",
                      "--expect", "cuda_graph_max_bs_decode=64", "--pid", str(proc.pid),
                      "--expect-env", "SGLANG_SM120_TRITON_INDEXER=1")
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)["version"] == "0.5.23"


def test_health_wait_names_each_mismatch(server):
    result = wait("--url", server, "--timeout", "10", "--expect", "context_length=8192",
                  "--pid", str(os.getpid()), "--expect-env", "SGLANG_SM120_MMA_ATTENTION=1")
    assert result.returncode == 1
    problems = json.loads(result.stdout)["mismatches"]
    assert any("context_length: server reports 131072, configured '8192'" in p for p in problems)
    assert any("SGLANG_SM120_MMA_ATTENTION" in p for p in problems)


def test_health_wait_plain_text_health_and_timeout(server):
    assert wait("--url", server, "--path", "/health", "--timeout", "5").returncode == 0
    result = wait("--url", "http://127.0.0.1:9", "--timeout", "1", "--interval", "0.2")
    assert result.returncode == 4 and "timed out" in result.stdout


@pytest.fixture
def router():
    """Answers like sglang-router 0.3.2: /health 200 even with no worker, /readiness and /generate 503
    until workers are up (``state["workers"]``); every request but /health needs the API key. A
    worker that died after registering (``state["dead"]``) leaves /readiness at 200 and fails /generate."""
    state = {"workers": 0, "key": "k-1", "generated": [], "dead": False}

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code, body):
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self):
            return self.headers.get("Authorization") == f"Bearer {state['key']}"

        def do_GET(self):
            if self.path == "/health":
                return self._answer(200, {"status": "ok"})
            if not self._authorized():
                return self._answer(401, {"error": "unauthorized"})
            ready = state["workers"] > 0
            self._answer(200 if ready else 503, {"ready": ready})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self._authorized():
                return self._answer(401, {"error": "unauthorized"})
            if not state["workers"]:
                return self._answer(503, {"error": "No available workers"})
            if state["dead"]:
                return self._answer(502, {"error": "worker http://127.0.0.1:30002: connection refused"})
            state["generated"].append(body)
            self._answer(200, {"text": "pong", "meta_info": {"completion_tokens": 1}})

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()


def _key_file(directory: Path, key: str) -> str:
    """The router's key file as the role writes it (root-only ``DSV4_ROUTER_API_KEY=...``)."""
    path = directory / "router-secret.env"
    path.write_text(f"# managed\nDSV4_ROUTER_API_KEY={key}\n")
    path.chmod(0o600)
    return str(path)


def test_router_is_ready_only_when_readiness_says_so_and_a_generate_goes_through(router, tmp_path):
    url, state = router
    key = _key_file(tmp_path, state["key"])
    # /health alone would pass with no worker; the wait reads /readiness and sends a /generate.
    assert wait("--url", url, "--path", "/health", "--timeout", "2").returncode == 0
    result = wait("--url", url, "--path", "/readiness", "--generate", "--api-key-file", key,
                  "--timeout", "1", "--interval", "0.2")
    assert result.returncode == 4 and "503" in result.stdout, result.stdout
    state["workers"] = 2
    result = wait("--url", url, "--path", "/readiness", "--generate", "--api-key-file", key,
                  "--timeout", "5")
    assert result.returncode == 0, result.stdout
    assert state["generated"] == [{"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}]



def test_a_wrong_key_fails_at_once_and_a_dead_worker_fails_at_the_generate(router, tmp_path):
    import time

    url, state = router
    state["workers"] = 2
    started = time.monotonic()
    wrong = wait("--url", url, "--path", "/readiness", "--generate", "--api-key-file", _key_file(tmp_path, "wrong"),
                 "--timeout", "30")
    assert wrong.returncode == 1 and time.monotonic() - started < 10, wrong.stdout
    assert "HTTP 401: the server refuses the API key" in wrong.stdout
    state["dead"] = True  # /readiness still 200
    result = wait("--url", url, "--path", "/readiness", "--generate", "--api-key-file",
                  _key_file(tmp_path, state["key"]), "--timeout", "1", "--interval", "0.2")
    assert result.returncode == 4, result.stdout
    out = json.loads(result.stdout)
    assert out["ready_by"] == "/generate" and "answered 502" in out["error"]
    assert "keeps answering with a dead worker" in out["error"]
    unreadable = wait("--url", url, "--api-key-file", str(tmp_path / "absent.env"), "--timeout", "1")
    assert unreadable.returncode == 1 and "cannot read the API key" in unreadable.stdout, unreadable.stdout


def _systemd_standins(directory: Path, state: str, sub: str, status: int) -> dict:
    """``systemctl show`` and ``journalctl -u`` of a unit in ``state``/``sub`` that exited ``status``."""
    directory.mkdir()
    (directory / "systemctl").write_text(
        "#!/bin/sh\n"
        f'[ "$1" = show ] || exit 1\necho ActiveState={state}\necho SubState={sub}\necho Result=exit-code\n'
        f"echo ExecMainStatus={status}\necho ExecMainCode=1\necho NRestarts=1\n")
    (directory / "journalctl").write_text(
        "#!/bin/sh\necho \"$*\" > " + str(directory / "journal-args") + "\n"
        "echo 'launch_server.py: error: unrecognized arguments: --enable-metric'\n")
    for tool in ("systemctl", "journalctl"):
        (directory / tool).chmod(0o755)
    return dict(os.environ, PATH=f"{directory}:{os.environ['PATH']}")


@pytest.mark.parametrize("state, sub", [("failed", "failed"), ("activating", "auto-restart")])
def test_a_unit_that_died_ends_the_wait_at_once_with_its_status_and_journal(tmp_path, state, sub):
    import time

    env = _systemd_standins(tmp_path / "bin", state, sub, 2)
    started = time.monotonic()
    result = wait("--url", "http://127.0.0.1:9", "--unit", "dsv4-decode.service", "--timeout", "1800", env=env)
    assert time.monotonic() - started < 20
    assert result.returncode == 1, result.stdout
    error = json.loads(result.stdout)["error"]
    assert error.startswith("dsv4-decode.service ") and "exit status 2" in error
    assert "unrecognized arguments: --enable-metric" in error
    assert (tmp_path / "bin/journal-args").read_text().split()[:2] == ["-u", "dsv4-decode.service"]


def test_a_unit_still_starting_is_waited_for(tmp_path):
    env = _systemd_standins(tmp_path / "bin", "active", "running", 0)
    result = wait("--url", "http://127.0.0.1:9", "--unit", "dsv4-decode.service", "--timeout", "1",
                  "--interval", "0.2", env=env)
    assert result.returncode == 4 and "timed out" in result.stdout


def test_unit_verifier(tmp_path):
    good = tmp_path / "good.service"
    good.write_text("[Unit]\nDescription=x\n\n[Service]\nExecStart=/bin/true\nEnvironmentFile=/etc/x.env\n\n"
                    "[Install]\nWantedBy=multi-user.target\n")
    bad = tmp_path / "bad.service"
    bad.write_text("[Unit]\nDescription=x\n\n[Service]\nExecStart=/nonexistent/python -m x\n")
    ok = subprocess.run([sys.executable, str(FILES / "verify_units.py"), str(good)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    broken = subprocess.run([sys.executable, str(FILES / "verify_units.py"), str(bad)], capture_output=True, text=True)
    assert broken.returncode == 1
    problems = " ".join(json.loads(broken.stdout)["problems"])
    assert "/nonexistent/python" in problems and "[Install]" in problems


# Behaves like nvidia-smi of driver 580.159.04 (checked on a real one) on an 8-GPU box: `-i` together
# with `-L` is rejected (rc 2); the query form prints one index per GPU that exists and leaves the
# others out, "No devices were found" with rc 6 when none exists.
FAKE_NVIDIA_SMI = r"""#!/bin/bash
ids="" query=0 list=0
while [ $# -gt 0 ]; do
  case "$1" in
    -i) ids=$2; shift ;;
    -L) list=1 ;;
    --query-gpu=index) query=1 ;;
  esac
  shift
done
if [ -n "$ids" ] && [ "$list" = 1 ]; then echo "ERROR: Option -i is not valid for this command"; exit 2; fi
if [ "$query" = 1 ]; then
  out=""
  for id in ${ids//,/ }; do
    if [ "$id" -ge 0 ] 2>/dev/null && [ "$id" -lt "${FAKE_GPU_COUNT:-8}" ]; then out="$out$id"$'\n'; fi
  done
  [ -n "$out" ] || { echo "No devices were found"; exit 6; }
  printf '%s' "$out"
  exit 0
fi
exit 0
"""


@pytest.fixture
def serve_preflight(tmp_path):
    """The rendered dsv4-serve-preflight, a venv python that reports SGLang 0.5.23, a model directory
    and a fake nvidia-smi first on PATH; returns run(gpus, visible, **env)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin/python"
    python.write_text(f"#!/bin/bash\n[ \"$1\" = -c ] && {{ echo 0.5.23; exit 0; }}\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake_bin / "nvidia-smi").chmod(0o755)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote  # Ansible's quote filter
    script = tmp_path / "dsv4-serve-preflight"
    script.write_text(env.get_template("dsv4-serve-preflight.j2").render(
        ansible_managed="test", dsv4_venv_dir=str(venv), dsv4_model_path=str(tmp_path / "model"),
        dsv4_sglang_version="0.5.23"))
    script.chmod(0o755)

    def run(gpus, visible, **extra):
        with socket.socket() as sock:  # a free port
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        environ = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", **extra)
        environ.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            environ["CUDA_VISIBLE_DEVICES"] = visible
        return subprocess.run([str(script), "decode", str(port), str(gpus)], capture_output=True, text=True,
                              timeout=60, env=environ)

    run.fake_bin = fake_bin
    return run


def test_fake_nvidia_smi_rejects_the_list_form(serve_preflight):
    smi = str(serve_preflight.fake_bin / "nvidia-smi")
    rejected = subprocess.run([smi, "-i", "4,5", "-L"], capture_output=True, text=True)
    assert rejected.returncode == 2 and "Option -i is not valid" in rejected.stdout
    listed = subprocess.run([smi, "-i", "4,5,9", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.split() == ["4", "5"]


def test_serve_preflight_accepts_the_units_gpus(serve_preflight):
    result = serve_preflight(4, "4,5,6,7")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_serve_preflight_names_missing_gpus(serve_preflight):
    result = serve_preflight(4, "4,5,6,7", FAKE_GPU_COUNT="6")
    assert result.returncode == 1
    assert result.stderr.strip() == "dsv4 preflight (decode): nvidia-smi sees 2 of the 4 GPUs 4,5,6,7"
    result = serve_preflight(4, "4,5,6,7", FAKE_GPU_COUNT="4")
    assert result.returncode == 1
    assert result.stderr.strip() == "dsv4 preflight (decode): nvidia-smi cannot list GPUs 4,5,6,7 (rc 6): No devices were found"


def test_serve_preflight_names_a_gpu_count_mismatch_and_unset_devices(serve_preflight):
    result = serve_preflight(4, "4,5")
    assert result.returncode == 1
    assert result.stderr.strip() == "dsv4 preflight (decode): nvidia-smi sees 2 of the 4 GPUs 4,5"
    result = serve_preflight(4, None)
    assert result.returncode == 1
    assert result.stderr.strip() == "dsv4 preflight (decode): CUDA_VISIBLE_DEVICES is not set in the unit"


# --- nvidia_driver: when is a driver reboot pending? ---------------------------------------------
# The GPU-less test box runs nvidia_driver in check mode, so the decision is exercised here: the
# role's own "Decide whether a reboot is pending" and GPU count tasks, run by ansible-playbook on
# localhost with the registered results they read given as variables.

ROLES = FILES.parents[1]
NVIDIA_SMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                        "Make sure that the latest NVIDIA driver is installed and running.")
# The first line of /proc/driver/nvidia/version with the open and with the closed (proprietary) module.
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)"
CLOSED_MODULE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 17:31:13 UTC 2025"
CLOSED_REASON = ("nvidia-smi -L fails (No devices were found) and the loaded kernel module is not the open one the installed "
                 f"nvidia-headless-580-open provides (/proc/driver/nvidia/version: {CLOSED_MODULE})")
REBOOT_CASES = {
    # name: (install changed, /var/run/reboot-required.pkgs or None, nvidia-smi rc, its output,
    #        /proc/driver/nvidia/version or None, reasons)
    "nothing": (False, None, 0, "GPU 0: NVIDIA RTX PRO 6000", OPEN_MODULE, []),
    "driver_installed_now": (True, None, 0, "", OPEN_MODULE, ["the driver install changed under a loaded module"]),
    # A first install: no module was loaded, the role's modprobe loaded it; no reboot.
    "first_install_loaded_now": (True, None, 0, "GPU 0: NVIDIA RTX PRO 6000", None, []),
    "kernel_update_only": (False, "linux-image-6.8.0-60-generic\nlibc6\n", 0, "GPU 0: NVIDIA RTX PRO 6000", OPEN_MODULE, []),
    "driver_upgraded": (False, "linux-base\nnvidia-kernel-common-580\nlibnvidia-compute-580\nnvidia-kernel-common-580\n",
                        0, "GPU 0: NVIDIA RTX PRO 6000", OPEN_MODULE,
                        ["/var/run/reboot-required.pkgs lists nvidia-kernel-common-580, libnvidia-compute-580"]),
    "no_devices": (False, None, 6, "No devices were found", OPEN_MODULE, []),
    "no_devices_no_module_file": (False, None, 6, "No devices were found", None, []),
    # An interrupted run installed the open packages over the loaded closed module.
    "no_devices_closed_module": (False, None, 6, "No devices were found", CLOSED_MODULE, [CLOSED_REASON]),
    # A box that works is never rebooted for the module it runs.
    "closed_module_working": (False, None, 0, "GPU 0: NVIDIA RTX PRO 6000", CLOSED_MODULE, []),
    "not_loaded": (False, None, 9, NVIDIA_SMI_NO_DRIVER, None, [f"nvidia-smi -L fails: {NVIDIA_SMI_NO_DRIVER}"]),
    "mismatch": (False, None, 18, "Failed to initialize NVML: Driver/library version mismatch", CLOSED_MODULE,
                 ["nvidia-smi -L fails: Failed to initialize NVML: Driver/library version mismatch"]),
}


def _role_task(role: str, name: str) -> dict:
    def walk(tasks):
        for task in tasks:
            if task.get("name") == name:
                return task
            found = walk(task.get("block", []))
            if found:
                return found
        return None

    for path in sorted((ROLES / role / "tasks").glob("*.yml")):  # main.yml imports the others
        task = walk(yaml.safe_load(path.read_text()))
        if task is not None:
            return task
    raise AssertionError(f"{role}: no task {name!r}")


@pytest.fixture(scope="module")
def reboot_decisions(tmp_path_factory):
    playbook_tool = shutil.which("ansible-playbook")
    if playbook_tool is None:
        pytest.skip("ansible-playbook not installed")
    tmp = tmp_path_factory.mktemp("reboot")
    defaults = yaml.safe_load((ROLES / "nvidia_driver/defaults/main.yml").read_text())
    decide = _role_task("nvidia_driver", "Decide whether a reboot is pending")
    count = dict(_role_task("nvidia_driver", "Check the GPU count nvidia-smi lists is {{ dsv4_gpu_count }}"),
                 ignore_errors=True, register="case_count")
    count.pop("when", None)
    plays = []
    for case, (changed, pkgs, rc, output, module, _) in REBOOT_CASES.items():
        smi = {"rc": rc, "stdout": output, "stderr": "", "stdout_lines": output.splitlines(), "changed": False}
        plays.append({
            "name": case, "hosts": "localhost", "connection": "local", "gather_facts": False,
            "vars": {**defaults, "ansible_python_interpreter": sys.executable,
                     "nvidia_driver_simulate": False, "dsv4_gpu_count": 8,
                     "nvidia_driver_install": {"changed": changed},
                     "nvidia_driver_reboot_pkgs": ({"content": base64.b64encode(pkgs.encode()).decode()}
                                                   if pkgs is not None else {"failed": True, "msg": "file not found"}),
                     "nvidia_driver_loaded_module": ({"content": base64.b64encode((module + "\n").encode()).decode()}
                                                     if module is not None else {"failed": True, "msg": "file not found"}),
                     "dsv4_driver_branch": "580",
                     "nvidia_driver_packages": defaults["nvidia_driver_packages_dkms_branched"],
                     "nvidia_driver_module_present": {"stat": {"exists": module is not None}},
                     "nvidia_driver_nouveau_left": {"stat": {"exists": False}},
                     "nvidia_driver_signed_kernels": [],
                     "nvidia_driver_smi_before": smi, "nvidia_driver_smi": smi},
            "tasks": [decide, count, {"name": "Keep the result", "ansible.builtin.copy": {
                "dest": str(tmp / f"{case}.json"),
                "content": "{{ {'reasons': nvidia_driver_reboot_reasons, 'count_msg': case_count.msg | default('')} | to_json }}",
                "mode": "0644"}}],
        })
    (tmp / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = subprocess.run([playbook_tool, "-i", "localhost,", str(tmp / "play.yml")], cwd=tmp, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return {case: json.loads((tmp / f"{case}.json").read_text()) for case in REBOOT_CASES}


@pytest.mark.parametrize("case", list(REBOOT_CASES))
def test_driver_reboot_is_pending_only_for_the_driver(reboot_decisions, case):
    """A reboot only when this run's install changed, an NVIDIA package asks for it, nvidia-smi says
    the driver is not loaded, or it fails while the closed module is loaded over the installed open
    packages: never for /var/run/reboot-required alone (kernel, libc updates) nor for "No devices were
    found" with the open module loaded, which a reboot does not fix."""
    assert reboot_decisions[case]["reasons"] == REBOOT_CASES[case][5]


def test_no_devices_is_left_to_the_gpu_count_check(reboot_decisions):
    assert reboot_decisions["no_devices"]["count_msg"].startswith(
        "nvidia-smi lists 0 GPUs, expected 8 (nvidia-smi -L exits 6: No devices were found). "
        "\"No devices were found\" on Blackwell means the proprietary")
    assert reboot_decisions["nothing"]["count_msg"].startswith("nvidia-smi lists 1 GPUs, expected 8.")
    # The driver changed since boot (an interrupted run): the message says how to tell, and to reboot.
    message = reboot_decisions["no_devices"]["count_msg"]
    assert "installed or changed since the box last booted" in message
    assert '`cat /proc/driver/nvidia/version` must name the "Open Kernel Module"' in message
    assert "reboot the box, then run `dsv4kit provision` again" in message
