"""The box side's one HTTP client: loopback requests to the serving ports, with the router's API key
as this process read it from the box's key file (``key.api_key``), never from argv or an environment.
The eval and profile scripts use it too (``dsv4box.http`` beside them on the box)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

from .key import api_key, start_client  # noqa: F401  (the scripts beside the package start clients through here)


def headers() -> dict:
    key = api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def local(port: int) -> str:
    """The base URL of a serving port on the box."""
    return f"http://127.0.0.1:{port}"


def open_request(url: str, path: str, body=None, timeout: float = 10.0, sent_headers=None):
    """The open response (a context manager) of one request to ``url + path``: POST with ``body`` as
    JSON, else GET. ``sent_headers``: the headers as given (None: the API key's and JSON's). An HTTP
    error status raises ``urllib.error.HTTPError``; no answer ``urllib.error.URLError``/``OSError``."""
    data = None if body is None else json.dumps(body).encode()
    if sent_headers is None:
        sent_headers = {"Content-Type": "application/json", **headers()}
    request = urllib.request.Request(url + path, data=data, headers=sent_headers,
                                     method="GET" if body is None else "POST")
    return urllib.request.urlopen(request, timeout=timeout)


def request(url: str, path: str, body=None, timeout: float = 10.0) -> tuple:
    """(status, body bytes) of one request (``open_request``); an HTTP error status comes back with
    its body, not raised. No answer raises ``urllib.error.URLError``/``OSError``."""
    try:
        with open_request(url, path, body, timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_get(port: int, path: str, timeout: float = 10.0):
    """(status, text) of ``GET path`` on a serving port; an HTTP error status raises."""
    with open_request(local(port), path, None, timeout, headers()) as response:
        return response.status, response.read().decode("utf-8", "replace")


def cmd_server_info(args) -> dict:
    try:
        status, body = http_get(args.port, "/server_info", args.timeout)
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": f"HTTP {exc.code} from /server_info"}
    except (urllib.error.URLError, OSError, socket.timeout) as exc:
        return {"ok": False, "error": f"no answer from 127.0.0.1:{args.port}/server_info: {getattr(exc, 'reason', exc)}"}
    try:
        return {"ok": True, "status": status, "server_info": json.loads(body)}
    except ValueError:
        return {"ok": False, "error": f"/server_info did not return JSON: {body[:200]!r}"}


def cmd_wait_health(args) -> dict:
    ports = [int(p) for p in args.ports.split(",") if p]
    deadline = time.monotonic() + args.timeout
    pending = set(ports)
    last = {}
    while pending:
        for port in sorted(pending):
            try:
                status, _ = http_get(port, "/health", 5.0)
                if status == 200:
                    pending.discard(port)
            except Exception as exc:  # not up yet
                last[port] = str(getattr(exc, "reason", exc))
        if not pending:
            break
        if time.monotonic() > deadline:
            return {"ok": False, "pending": sorted(pending), "last_error": {str(k): v for k, v in last.items()}}
        time.sleep(args.interval)
    return {"ok": True, "ports": ports}



def post(port: int, path: str, body: dict, timeout: float):
    """The body of ``POST path`` on a serving port; an HTTP error status raises."""
    with open_request(local(port), path, body, timeout) as response:
        return response.read()


def server_info(port: int, timeout: float = 10.0) -> dict:
    """``GET /server_info`` as JSON (raises on no answer or no JSON)."""
    _, body = http_get(port, "/server_info", timeout)
    return json.loads(body)
