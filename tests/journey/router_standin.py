"""The router unit's program on the simulated box: ``dsv4-router-launch`` (the role's own file) with
sglang-router 0.3.2's own parser, and a stand-in for the router it would start.

Usage: router_standin.py LAUNCHER ROUTER_ARGS... The launcher parses ROUTER_ARGS plus the key from
``$DSV4_ROUTER_API_KEY`` with ``sglang_router.launch_router.parse_router_args``; a parse error exits 2
as the real one does. Then, instead of the Rust router, a stand-in that answers like sglang-router
0.3.2 in PD mode:
* ``/health`` 200 even with no worker; ``/readiness`` 200 only while every prefill and decode
  worker answers ``/health``; ``/generate`` 503 "No available workers" otherwise;
* ``/generate`` goes to a prefill and a decode worker, with the bootstrap fields the router adds;
  the decode worker's stream comes back to the client as it arrives. The real router sends both at
  once and the decode server waits for the KV; here decode is sent when prefill has answered,
  which the client sees the same way (its first token comes after the prefill);
* ``/v1/chat/completions`` goes the same way as ``/generate`` (the real router's ``route_chat``:
  the client's body with the bootstrap fields, to both workers; the decode worker's answer back;
  the workers' OpenAI layer renders and parses, the router parses nothing);
* ``/flush_cache`` goes to every worker; ``/v1/models`` to the first prefill worker (as the real
  router's ``get_models``) and ``/model_info`` to a worker;
  ``/server_info`` is ``{"prefill": [...], "decode": [...]}``, one entry per worker;
* the router's key is required on everything but ``/health`` and sent on to the workers;
* ``--prometheus-host``/``--prometheus-port``: the router's ``/metrics`` (tests/fake_exporters.py's
  sglang-router 0.3.2 request counters), which the monitoring role's Prometheus scrapes.
"""

from __future__ import annotations

import http.client
import itertools
import json
import runpy
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

_HEALTH_TTL_S = 2.0  # the real router health-checks workers in the background, not per request


class Workers:
    def __init__(self, args):
        self.prefill = [(url, port) for url, port in args.prefill_urls]
        self.decode = list(args.decode_urls)
        self.all = [url for url, _ in self.prefill] + self.decode
        self.key = args.api_key
        self._seen: dict[str, float] = {}
        self._rooms = itertools.count(1)

    def headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return headers

    def up(self) -> bool:
        if not self.all:
            return False
        now = time.monotonic()
        for url in self.all:
            if now - self._seen.get(url, -1e9) < _HEALTH_TTL_S:
                continue
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if response.status != 200:
                        return False
            except (urllib.error.URLError, OSError):
                return False
            self._seen[url] = now
        return True

    def call(self, url: str, method: str, path: str, body: bytes | None = None, timeout: float = 60):
        request = urllib.request.Request(url + path, data=body, headers=self.headers(), method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def pd_bodies(self, raw: bytes) -> tuple[str, bytes]:
        """The prefill worker's URL and the request with the bootstrap fields the router adds."""
        url, bootstrap_port = self.prefill[0]
        fields = json.dumps({"bootstrap_host": urlparse(url).hostname, "bootstrap_port": bootstrap_port,
                             "bootstrap_room": next(self._rooms)})[1:-1].encode()
        # Spliced in, not re-encoded: a 128K-token prompt is ~1 MB of JSON, and this stand-in shares
        # two cores with the client and both servers.
        rest = (raw or b"{}").lstrip()[1:]
        return url, b"{" + fields + (b"" if rest.lstrip().startswith(b"}") else b",") + rest


def serve(args) -> None:
    workers = Workers(args)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code: int, data: bytes, kind: str = "application/json"):
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _json(self, code, body):
            self._send(code, json.dumps(body).encode())

        def _authorized(self):
            return not args.api_key or self.headers.get("Authorization") == f"Bearer {args.api_key}"

        def do_GET(self):
            path = urlparse(self.path).path
            if path == "/health":
                return self._json(200, {"status": "ok"})
            if not self._authorized():
                return self._json(401, {"error": "Unauthorized"})
            if path == "/readiness":
                ready = workers.up()
                return self._json(200 if ready else 503, {"ready": ready})
            if not workers.up():
                return self._json(503, {"error": "No available workers"})
            if path == "/v1/models":  # the real PD router asks its first prefill worker (get_models)
                return self._send(*workers.call(workers.prefill[0][0], "GET", path))
            if path in ("/model_info", "/get_model_info"):
                return self._send(*workers.call(workers.decode[0], "GET", path))
            if path in ("/server_info", "/get_server_info"):
                info = {"prefill": [json.loads(workers.call(url, "GET", path)[1]) for url, _ in workers.prefill],
                        "decode": [json.loads(workers.call(url, "GET", path)[1]) for url in workers.decode]}
                return self._json(200, info)
            self._json(404, {"error": "not found"})

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = urlparse(self.path).path
            if not self._authorized():
                return self._json(401, {"error": "Unauthorized"})
            if path not in ("/generate", "/flush_cache", "/v1/chat/completions"):
                return self._json(404, {"error": "not found"})
            if not workers.up():
                return self._json(503, {"error": "No available workers"})
            if path == "/flush_cache":
                answers = [workers.call(url, "POST", path, b"") for url in workers.all]
                bad = [f"{url}: {code}" for url, (code, _) in zip(workers.all, answers) if code != 200]
                return self._json(500, {"error": "flush failed on " + ", ".join(bad)}) if bad else \
                    self._send(200, b"Cache flushed.\n", "text/plain")
            self._generate(raw, path)

        def _generate(self, raw: bytes, path: str = "/generate") -> None:
            prefill_url, body = workers.pd_bodies(raw)
            code, answer = workers.call(prefill_url, "POST", path, body, timeout=3600)
            if code != 200:
                return self._send(code, answer)
            decode = urlparse(workers.decode[0])
            conn = http.client.HTTPConnection(decode.hostname, decode.port, timeout=3600)
            try:
                conn.request("POST", path, body, workers.headers())
                response = conn.getresponse()
                if "event-stream" not in (response.getheader("Content-Type") or ""):
                    return self._send(response.status, response.read(),
                                      response.getheader("Content-Type") or "application/json")
                self.send_response(response.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while chunk := response.read1(65536):
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            finally:
                conn.close()

    class Server(ThreadingHTTPServer):
        request_queue_size = 2048  # as tests/fake_sglang_server.py: C connections open at once
        daemon_threads = True

    if getattr(args, "prometheus_port", None):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import fake_exporters

        metrics = ThreadingHTTPServer((args.prometheus_host or "127.0.0.1", args.prometheus_port),
                                      fake_exporters.make_handler(fake_exporters.Router()))
        metrics.daemon_threads = True
        threading.Thread(target=metrics.serve_forever, daemon=True).start()
    Server((args.host, args.port), Handler).serve_forever()


def main() -> None:
    import sglang_router.launch_router as launch

    launch.launch_router = serve
    launcher, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(launcher, run_name="__main__")


if __name__ == "__main__":
    main()
