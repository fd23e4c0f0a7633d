"""The router unit's program on the simulated box: ``dsv4-router-launch`` (the role's own file) with
sglang-router 0.3.2's own parser, and a stand-in for the router it would start.

Usage: router_standin.py LAUNCHER ROUTER_ARGS... The launcher parses ROUTER_ARGS plus the key from
``$DSV4_ROUTER_API_KEY`` with ``sglang_router.launch_router.parse_router_args``; a parse error exits 2
as the real one does. Then, instead of the Rust router, a stand-in that answers like sglang-router
0.3.2 in PD mode: ``/health`` 200 even with no worker; ``/readiness`` 200 only while every prefill
and decode worker answers ``/health``; ``/generate`` 503 "No available workers" otherwise, else sent to
the decode worker with the router's key; the key required on everything but ``/health``.
"""

from __future__ import annotations

import json
import runpy
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve(args) -> None:
    workers = [url for url, _ in args.prefill_urls] + list(args.decode_urls)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _json(self, code, body):
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self):
            return not args.api_key or self.headers.get("Authorization") == f"Bearer {args.api_key}"

        def do_GET(self):
            if self.path == "/health":
                return self._json(200, {"status": "ok"})
            if not self._authorized():
                return self._json(401, {"error": "Unauthorized"})
            if self.path == "/readiness":
                ready = bool(workers) and all(_up(url) for url in workers)
                return self._json(200 if ready else 503, {"ready": ready})
            self._json(404, {"error": "not found"})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self._authorized():
                return self._json(401, {"error": "Unauthorized"})
            if self.path != "/generate":
                return self._json(404, {"error": "not found"})
            if not workers or not all(_up(url) for url in workers):
                return self._json(503, {"error": "No available workers"})
            headers = {"Content-Type": "application/json"}
            if args.api_key:
                headers["Authorization"] = f"Bearer {args.api_key}"
            request = urllib.request.Request(args.decode_urls[0] + "/generate", data=body, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return self._json(response.status, json.loads(response.read()))
            except urllib.error.HTTPError as exc:
                return self._json(exc.code, {"error": exc.read().decode(errors="replace")})

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


def main() -> None:
    import sglang_router.launch_router as launch

    launch.launch_router = serve
    launcher, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(launcher, run_name="__main__")


if __name__ == "__main__":
    main()
