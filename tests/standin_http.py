"""What every loopback HTTP stand-in does around its handler (tests only): bind 127.0.0.1, write
the bound port to ``--port-file`` atomically, serve until ``--max-lifetime`` s have passed."""

from __future__ import annotations

import os
import threading
from http.server import ThreadingHTTPServer


def send(handler, code: int, data: bytes, kind: str) -> None:
    """One whole response with its length (keep-alive safe)."""
    handler.send_response(code)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def serve(handler_class, *, port: int = 0, port_file: str | None = None, max_lifetime: float = 600.0,
          server_class=ThreadingHTTPServer) -> int:
    server = server_class(("127.0.0.1", port), handler_class)
    server.daemon_threads = True
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(str(server.server_address[1]))
        os.replace(tmp, port_file)
    timer = threading.Timer(max_lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0
