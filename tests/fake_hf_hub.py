"""A stand-in for the Hugging Face Hub on 127.0.0.1, as hostile as the real one, for the weights stage.

It speaks the part of the Hub's HTTP API that ``huggingface_hub`` uses to read a model and download
its files (point ``HF_ENDPOINT``, or ``endpoint=``, at ``FakeHub.url``):

* ``GET /api/models/<repo>/revision/<rev>[?blobs=true]``: the model info; with ``blobs`` each
  sibling carries ``size``, ``blobId`` and, for LFS files, ``lfs: {sha256, size, pointerSize}``.
* ``HEAD|GET /<repo>/resolve/<rev>/<file>``: a small file answers with a relative 307 to
  ``/api/resolve-cache/models/<repo>/<commit>/<file>``, which serves it with ``ETag`` (its git blob
  id) and ``X-Repo-Commit``; an LFS file answers 302 to a signed URL on a second origin (the
  "CDN"), with ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and ``X-Repo-Commit``.
* The CDN, like a signed storage URL, refuses a request that carries an ``Authorization`` header
  or lacks the signature, honours ``Range`` and (``drop_first_lfs_get``) cuts the first GET of
  the largest file half-way, as real networks do.

The repository is gated: no token gets 401 with ``X-Error-Code: GatedRepo``, a wrong one 401 with
``X-Error-Message: Invalid credentials in Authorization header``. Every request is logged in
``FakeHub.requests`` as ``(method, path, authorization header or None)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_THRESHOLD = 10 * 1024  # files at least this big are stored in LFS (the Hub: 10 MB, scaled down)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    commit: str
    files: dict[str, bytes]
    branch: str = "main"

    def is_lfs(self, name: str) -> bool:
        return len(self.files[name]) >= LFS_THRESHOLD

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if self.is_lfs(name):
            # The git blob of an LFS file is its pointer; the Hub reports the pointer's blob id.
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n".encode()
            entry["blobId"] = git_blob_id(pointer)
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)}
        return entry


@dataclass
class FakeHub:
    repo: FakeRepo
    token: str
    drop_first_lfs_get: bool = True
    requests: list = field(default_factory=list)
    _servers: list = field(default_factory=list)
    _dropped: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://localhost:{self._servers[1].server_address[1]}"

    def downloads(self) -> list[str]:
        """The file GETs that reached the CDN or the resolve cache (bytes actually sent)."""
        return [path for method, path, _ in self.requests
                if method == "GET" and (path.startswith("/cdn/") or path.startswith("/api/resolve-cache/"))]

    def start(self) -> "FakeHub":
        for handler in (self._hub_handler(), self._cdn_handler()):
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    # --- handlers ---

    def _log(self, request: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append((request.command, request.path, request.headers.get("Authorization")))

    def _hub_handler(self):
        hub = self

        class Hub(_Base):
            def do_GET(self):
                self.handle_hub(send_body=True)

            def do_HEAD(self):
                self.handle_hub(send_body=False)

            def handle_hub(self, send_body: bool):
                hub._log(self)
                path = unquote(urlsplit(self.path).path)
                query = parse_qs(urlsplit(self.path).query)
                repo = hub.repo
                api = f"/api/models/{repo.repo_id}/revision/"
                resolve = f"/{repo.repo_id}/resolve/"
                cache = f"/api/resolve-cache/models/{repo.repo_id}/"
                if not (path.startswith(api) or path.startswith(resolve) or path.startswith(cache)):
                    return self.error(404, "RepoNotFound", "Repository not found", send_body)
                if not self.authorized(send_body):
                    return
                if path.startswith(api):
                    revision = path[len(api):]
                    if revision not in (repo.commit, repo.branch):
                        return self.error(404, "RevisionNotFound", "Invalid rev id: " + revision, send_body)
                    siblings = [repo.sibling(name) if query.get("blobs") == ["true"] else {"rfilename": name}
                                for name in sorted(repo.files)]
                    info = {"_id": "fake", "id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit,
                            "private": False, "gated": "auto", "disabled": False, "tags": [], "siblings": siblings}
                    return self.reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, send_body)
                if path.startswith(cache):
                    commit, _, name = path[len(cache):].partition("/")
                    if commit != repo.commit or name not in repo.files or repo.is_lfs(name):
                        return self.error(404, "EntryNotFound", "Entry not found", send_body)
                    data = repo.files[name]
                    return self.reply(200, data, {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": repo.commit,
                                                  "Content-Type": "application/octet-stream"}, send_body)
                revision, _, name = path[len(resolve):].partition("/")
                if revision not in (repo.commit, repo.branch):
                    return self.error(404, "RevisionNotFound", "Invalid rev id: " + revision, send_body)
                if name not in repo.files:
                    return self.error(404, "EntryNotFound", "Entry not found", send_body, commit=repo.commit)
                data = repo.files[name]
                if repo.is_lfs(name):
                    sha = hashlib.sha256(data).hexdigest()
                    location = f"{hub.cdn_url}/cdn/{sha}?X-Amz-Signature=fake&name={quote(name)}"
                    return self.reply(302, b"", {"Location": location, "X-Linked-Etag": f'"{sha}"',
                                                 "X-Linked-Size": str(len(data)), "X-Repo-Commit": repo.commit,
                                                 "ETag": f'"{repo.sibling(name)["blobId"]}"'}, send_body)
                target = f"{cache}{repo.commit}/{quote(name)}"
                return self.reply(307, b"", {"Location": target, "X-Repo-Commit": repo.commit}, send_body)

            def authorized(self, send_body: bool) -> bool:
                header = self.headers.get("Authorization")
                if header is None:
                    self.error(401, "GatedRepo", f"Access to model {hub.repo.repo_id} is restricted. You must have "
                               "access to it and be authenticated to access it. Please log in.", send_body)
                    return False
                if header != f"Bearer {hub.token}":
                    self.error(401, None, "Invalid credentials in Authorization header", send_body)
                    return False
                return True

        return Hub

    def _cdn_handler(self):
        hub = self

        class Cdn(_Base):
            def do_HEAD(self):
                self.handle_cdn(send_body=False)

            def do_GET(self):
                self.handle_cdn(send_body=True)

            def handle_cdn(self, send_body: bool):
                hub._log(self)
                parts = urlsplit(self.path)
                if self.headers.get("Authorization") is not None:
                    body = b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed</Message></Error>"
                    return self.reply(400, body, {"Content-Type": "application/xml"}, send_body)
                if parse_qs(parts.query).get("X-Amz-Signature") != ["fake"]:
                    return self.reply(403, b"<Error><Code>AccessDenied</Code></Error>", {}, send_body)
                sha = parts.path.removeprefix("/cdn/")
                data = next((d for d in hub.repo.files.values() if hashlib.sha256(d).hexdigest() == sha), None)
                if data is None:
                    return self.reply(404, b"<Error><Code>NoSuchKey</Code></Error>", {}, send_body)
                start = 0
                ranged = self.headers.get("Range")
                if ranged and ranged.startswith("bytes="):
                    start = int(ranged[len("bytes="):].split("-")[0])
                body = data[start:]
                headers = {"Content-Type": "application/octet-stream", "ETag": f'"{sha}"', "Accept-Ranges": "bytes"}
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                largest = max(hub.repo.files.values(), key=len)
                with hub._lock:
                    drop = (send_body and hub.drop_first_lfs_get and data is largest and not start
                            and sha not in hub._dropped)
                    if drop:
                        hub._dropped.add(sha)
                if drop:  # promise the whole file, send half, hang up
                    self.send_response(200)
                    for name, value in {**headers, "Content-Length": str(len(body))}.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                return self.reply(206 if start else 200, body, headers, send_body)

        return Cdn


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def reply(self, status: int, body: bytes, headers: dict, send_body: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def error(self, status: int, code: str | None, message: str, send_body: bool, commit: str | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        self.reply(status, json.dumps({"error": message}).encode(), headers, send_body)


def tiny_repo(repo_id: str = "dsv4kit-test/Tiny-V4", commit: str = "1f0a5ce0d8c3b7e2a4f6081c9d2e3b4a5c6d7e8f",
              drafter: str = "") -> FakeRepo:
    """A small model repository: config and tokenizer (plain git), two safetensors shards (LFS)
    and a file in a subdirectory; with ``drafter`` "bundled", the DSpark drafter in the checkpoint
    itself (config.json's dspark_* keys, mtp.* tensors in the index), as DeepSeek-V4-Flash-0731
    ships it; with another ``drafter``, a DSpark draft model in that folder (its config.json and one
    LFS shard), SGLang's other convention."""
    shard = lambda seed, size: hashlib.shake_256(seed).digest(size)  # noqa: E731
    files = {
        "config.json": json.dumps({"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 2}).encode(),
        "tokenizer.json": json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}).encode(),
        "model.safetensors.index.json": json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                   "b": "model-00002-of-00002.safetensors"}}).encode(),
        "model-00001-of-00002.safetensors": shard(b"one", 200_000),
        "model-00002-of-00002.safetensors": shard(b"two", 64_000),
        "encoding/encode_messages.py": b"# how messages are encoded\n",
    }
    if drafter == "bundled":
        files["config.json"] = json.dumps({"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 2,
                                           "dspark_block_size": 5, "dspark_target_layer_ids": [0, 1]}).encode()
        files["model.safetensors.index.json"] = json.dumps({"weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
            "mtp.0.a": "model-00002-of-00002.safetensors"}}).encode()
    elif drafter:
        files[f"{drafter}/config.json"] = json.dumps({"architectures": ["DeepseekV4ForCausalLMDSpark"],
                                                      "dspark_config": {"block_size": 3}}).encode()
        files[f"{drafter}/model.safetensors"] = shard(b"drafter", 48_000)
    return FakeRepo(repo_id=repo_id, commit=commit, files=files)
