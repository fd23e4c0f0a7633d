"""A loopback stand-in for the Hugging Face Hub: the subset of its HTTP API huggingface_hub uses to
read a model's metadata and download its files (HF_ENDPOINT points at it).

GET /api/models/{repo}/revision/{rev}   model info: the commit, and per file its size, blobId and,
                                        for LFS files, the sha256 (files_metadata=True)
GET /api/models/{repo}/tree/{rev}       the file listing snapshot_download filters
HEAD|GET /{repo}/resolve/{rev}/{file}   the file, with X-Repo-Commit, ETag / X-Linked-Etag, sizes
A branch name resolves to the commit; an unknown revision is a 404 with X-Error-Code, as the hub
answers. ``corrupt`` names files served with other bytes than the metadata promises (a hostile
mirror); ``requests`` records every path asked for; ``token`` (when set) is required.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class FakeHub:
    def __init__(self, repo: str, files: dict[str, bytes], *, commit: str = "a" * 40, lfs_min: int = 64,
                 token: str | None = None):
        self.repo, self.files, self.commit, self.token = repo, files, commit, token
        self.lfs = {name for name, data in files.items() if len(data) >= lfs_min}
        self.corrupt: set[str] = set()
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "FakeHub":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _sibling(self, name: str) -> dict:
        data = self.files[name]
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entry = {"rfilename": name, "size": len(data), "blobId": blob}
        if name in self.lfs:
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code, body=b"", headers=None, head=False):
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _resolve(self, revision):
                return hub.commit if revision in (hub.commit, "main") else None

            def _serve(self, head):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, b'{"error":"Invalid credentials"}', {"X-Error-Code": "GatedRepo"}, head)
                api = f"/api/models/{hub.repo}/revision/"
                if path.startswith(api):
                    commit = self._resolve(path[len(api):])
                    if commit is None:
                        return self._send(404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, head)
                    info = {"id": hub.repo, "modelId": hub.repo, "sha": commit, "private": False,
                            "siblings": [hub._sibling(n) for n in sorted(hub.files)]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                tree = f"/api/models/{hub.repo}/tree/"
                if path.startswith(tree):
                    if self._resolve(path[len(tree):].split("/")[0]) is None:
                        return self._send(404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, head)
                    entries, folders = [], set()
                    for name in sorted(hub.files):
                        parts = name.split("/")[:-1]
                        folders.update("/".join(parts[:i + 1]) for i in range(len(parts)))
                        meta = hub._sibling(name)
                        entry = {"type": "file", "oid": meta["blobId"], "size": meta["size"], "path": name}
                        if "lfs" in meta:
                            entry["lfs"] = {"oid": meta["lfs"]["sha256"], "size": meta["size"], "pointerSize": 134}
                        entries.append(entry)
                    entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
                    return self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
                prefix = f"/{hub.repo}/resolve/"
                if path.startswith(prefix):
                    revision, _, name = path[len(prefix):].partition("/")
                    commit = self._resolve(revision)
                    if commit is None or name not in hub.files:
                        return self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"}, head)
                    data = hub.files[name]
                    meta = hub._sibling(name)
                    etag = meta["lfs"]["sha256"] if "lfs" in meta else meta["blobId"]
                    if name in hub.corrupt:
                        data = bytes(len(data))  # the promised size, other bytes
                    headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"}
                    if "lfs" in meta:
                        headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
                    return self._send(200, data, headers, head)
                return self._send(404, b"unknown path", {}, head)

            def do_GET(self):
                self._serve(False)

            def do_HEAD(self):
                self._serve(True)

        return Handler
