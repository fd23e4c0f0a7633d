"""The box-side helper scripts of the sglang_service role, run for real: the health wait against a
local HTTP server answering like SGLang's /server_info, and the unit verifier on good and broken
units. (On the GPU-less test box the units are never started, so this is where the health wait's
checks are exercised.)"""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[1] / "playbooks/roles/sglang_service/files"
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
