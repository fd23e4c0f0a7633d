"""``grafana server`` on the simulated box (tests/fake_gpu_box.py's grafana package runs this).

Real Grafana cannot run here, so this stands in for what the journey relies on, and fails the way
Grafana fails at start: it reads the ``--config`` grafana.ini (paths resolved in the box's root,
``--root``), needs ``[security] admin_password`` as ``$__file{PATH}`` naming a readable, non-empty
file, refuses anonymous access being on, and loads the provisioning directory (``[paths]
provisioning``, else ``cfg:default.paths.provisioning``): every datasource needs a name, a type and
a URL; every dashboard provider's ``options.path`` must hold dashboards that parse as JSON with a
title, a uid and panels. Then it listens on ``[server] http_addr:http_port`` and answers
``/api/health`` (no login), ``/api/search`` and ``/api/datasources`` (basic auth as admin).
"""

from __future__ import annotations

import argparse
import base64
import configparser
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standin_http import send  # noqa: E402  (run as a script on the simulated box)

VERSION = "11.6.0"


def _on_root(root: str, path: str) -> Path:
    rooted = Path(root + path)
    return rooted if path.startswith("/") and rooted.exists() else Path(path)


def load(root: str, config: str, defaults: dict) -> dict:
    """The server's settings and what it provisioned; SystemExit(1) with Grafana-like messages."""
    ini = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    ini.read_string(_on_root(root, config).read_text())
    secret = ini.get("security", "admin_password", fallback="admin")
    match = re.fullmatch(r"\$__file\{(.+)\}", secret)
    if not match:
        sys.exit("grafana: admin_password is not read from a file ($__file{...}): the stand-in refuses it")
    password_file = _on_root(root, match.group(1))
    try:
        password = password_file.read_text().strip()
    except OSError as exc:
        sys.exit(f"Failed to start grafana. error: failed to read {password_file}: {exc}")
    if not password:
        sys.exit(f"Failed to start grafana. error: {password_file} is empty")
    if ini.getboolean("auth.anonymous", "enabled", fallback=False):
        sys.exit("grafana stand-in: anonymous access is on")
    provisioning = _on_root(root, ini.get("paths", "provisioning", fallback=defaults.get("paths.provisioning", "")))
    datasources, dashboards = [], []
    for path in sorted((provisioning / "datasources").glob("*.y*ml")):
        for source in yaml.safe_load(path.read_text()).get("datasources") or []:
            if not all(source.get(k) for k in ("name", "type", "url")):
                sys.exit(f"Datasource provisioning error: {path}: a datasource lacks name, type or url: {source}")
            datasources.append(source)
    for path in sorted((provisioning / "dashboards").glob("*.y*ml")):
        for provider in yaml.safe_load(path.read_text()).get("providers") or []:
            folder = _on_root(root, provider["options"]["path"])
            for board in sorted(folder.glob("*.json")):
                try:
                    body = json.loads(board.read_text())
                except ValueError as exc:
                    sys.exit(f"Dashboard provisioning error: {board}: {exc}")
                if not (body.get("title") and body.get("uid") and body.get("panels")):
                    sys.exit(f"Dashboard provisioning error: {board}: no title, uid or panels")
                dashboards.append({"uid": body["uid"], "title": body["title"], "type": "dash-db",
                                   "panels": len(body["panels"])})
    return {"addr": ini.get("server", "http_addr", fallback="0.0.0.0"),
            "port": ini.getint("server", "http_port", fallback=3000), "password": password,
            "datasources": datasources, "dashboards": dashboards}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="")
    parser.add_argument("command", choices=["server"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--pidfile")
    parser.add_argument("--packaging")
    args, rest = parser.parse_known_args(argv)
    defaults = dict(item[len("cfg:default."):].split("=", 1) for item in rest if item.startswith("cfg:default."))
    settings = load(args.root, args.config, defaults)
    login = "Basic " + base64.b64encode(f"admin:{settings['password']}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _json(self, code: int, body) -> None:
            send(self, code, json.dumps(body).encode(), "application/json")

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/api/health":
                return self._json(200, {"database": "ok", "version": VERSION})
            if self.headers.get("Authorization") != login:
                return self._json(401, {"message": "Unauthorized"})
            if path == "/api/search":
                return self._json(200, settings["dashboards"])
            if path == "/api/datasources":
                return self._json(200, settings["datasources"])
            return self._json(404, {"message": "Not found"})

    server = ThreadingHTTPServer((settings["addr"], settings["port"]), Handler)
    server.daemon_threads = True
    print(f"HTTP Server Listen address={settings['addr']}:{settings['port']} dashboards={len(settings['dashboards'])}",
          flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
