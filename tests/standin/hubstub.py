"""STAND-IN for tests: a local imitation of the Hugging Face hub's HTTP file API (the hub cannot be reached from
these machines); never used by the product.

Serves generated tiny model repos on 127.0.0.1 with the two routes deployer's fetch uses:

    GET /api/models/{org}/{name}/revision/{rev}[?blobs=true]   {"id", "sha", "siblings": [{rfilename, size,
                                                                 blobId, lfs: {sha256, size}}]}
    GET /{org}/{name}/resolve/{commit or rev}/{file}            the bytes (honours `Range: bytes=N-` and
                                                                 `bytes=N-M` with 206)

Knobs (attributes of `HubStub`, changeable while it runs): `rate` (bytes/s per transfer, 0 = as fast as it can),
`cut_after` (close the connection after this many bytes of a file transfer) for the next `cuts` transfers
longer than that,
`lie` (file -> the size the listing claims instead of the real one), `corrupt` (files sent with their last byte
changed: the listing keeps their real size and sha256, the bytes do not match it), `ranges` (False: ignore Range,
send 200 and the whole file), `token` (required as `Authorization: Bearer`). It counts the bytes it sent per file
(`served`), the Range starts it was asked for (`starts`; whole ranges: `ranges_asked`), the most transfers at once
(`most_in_flight`) and every request line (`requests`). `cdn`: an endpoint (another
HubStub, or this one by another address) file downloads are redirected to, as the hub sends LFS files to its CDN.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class RepoFile:
    name: str
    data: bytes
    lfs: bool

    @property
    def blob_id(self) -> str:
        """The git blob id (sha1 of `blob <len>\\0<data>`), as the hub lists it."""
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Repo:
    """One revision of a repo: its commit and files."""

    repo_id: str
    commit: str
    files: list[RepoFile]
    branches: dict[str, str] = field(default_factory=dict)   # branch or tag -> commit

    @property
    def total(self) -> int:
        return sum(len(f.data) for f in self.files)


def tiny_repo(repo_id: str, weights_bytes: int = 2_000_000, seed: str = "v1",
              architecture: str = "LlamaForCausalLM") -> Repo:
    """A generated tiny model: config.json, tokenizer.json (plain files) and model.safetensors (LFS, pseudo-random
    bytes from `seed`); its commit is derived from the contents."""
    config = json.dumps({"architectures": [architecture], "hidden_size": 64, "num_hidden_layers": 2,
                         "seed": seed}).encode()
    tokenizer = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}).encode()
    block = hashlib.sha256(seed.encode()).digest() * 2048
    weights = (block * (weights_bytes // len(block) + 1))[:weights_bytes]
    files = [RepoFile("config.json", config, False), RepoFile("tokenizer.json", tokenizer, False),
             RepoFile("model.safetensors", weights, True)]
    commit = hashlib.sha1(b"".join(hashlib.sha1(f.data).digest() for f in files)).hexdigest()
    return Repo(repo_id, commit, files, {"main": commit})


def repo_from_dir(repo_id: str, folder: Path) -> Repo:
    """A real model folder (tests' tiny Llama) as a repo: `*.safetensors` as LFS files, the rest plain."""
    files = [RepoFile(p.name, p.read_bytes(), p.suffix == ".safetensors")
             for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")]
    commit = hashlib.sha1(b"".join(hashlib.sha1(f.data).digest() for f in files)).hexdigest()
    return Repo(repo_id, commit, files, {"main": commit})


class HubStub:
    """The stand-in hub on 127.0.0.1 (an ephemeral port): `endpoint` is its URL; `with HubStub(...) as hub:`."""

    def __init__(self, *repos: Repo) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.rate = 0
        self.cut_after: int | None = None
        self.cuts = 0
        self.lie: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.ranges = True
        self.token: str | None = None
        self.cdn: str | None = None    # an endpoint to redirect file downloads to (302), as the hub does for LFS
        self.served: dict[str, int] = {}
        self.starts: list[tuple[str, int]] = []
        self.ranges_asked: list[tuple[str, int, int]] = []   # (file, first byte, last byte) of each Range asked
        self.in_flight = 0          # file transfers under way now
        self.most_in_flight = 0     # ... and at most, so far
        self.requests: list[str] = []
        self.auth_seen: list[str | None] = []
        self.last_byte_at: float | None = None     # time.time() of the last file byte sent
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="hubstub", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def publish(self, repo: Repo) -> None:
        """A new revision of a repo (its `main` moves to it); the commits before stay fetchable."""
        with self._lock:
            old = self.repos.get(repo.repo_id)
            if old is not None:
                self._old = getattr(self, "_old", {})
                self._old[old.commit] = old
            self.repos[repo.repo_id] = repo

    def find(self, repo_id: str, rev: str) -> Repo | None:
        with self._lock:
            repo = self.repos.get(repo_id)
            if repo is not None and (rev == repo.commit or rev in repo.branches):
                return repo
            old = getattr(self, "_old", {}).get(rev)
            return old if old is not None and old.repo_id == repo_id else None

    def count(self, name: str, n: int) -> None:
        with self._lock:
            self.served[name] = self.served.get(name, 0) + n

    def __enter__(self) -> HubStub:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


API_RE = re.compile(r"\A/api/models/([^/]+/[^/]+)/revision/([^/?]+)(?:\?.*)?\Z")
RESOLVE_RE = re.compile(r"\A/([^/]+/[^/]+)/resolve/([^/]+)/(.+)\Z")


def _handler(hub: HubStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read hub.requests
            pass

        def do_GET(self) -> None:
            hub.requests.append(self.path)
            auth = self.headers.get("Authorization")
            hub.auth_seen.append(auth)
            if hub.token is not None and auth != f"Bearer {hub.token}" and not self.path.startswith("/cdn/"):
                return self._json(401, {"error": "Invalid credentials in Authorization header"})
            if hub.cdn is not None and RESOLVE_RE.match(self.path):
                self.send_response(302)
                self.send_header("Location", hub.cdn + "/cdn" + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.startswith("/cdn/"):
                self.path = self.path[len("/cdn"):]
            api, resolve = API_RE.match(self.path), RESOLVE_RE.match(self.path)
            if api:
                return self._listing(api.group(1), api.group(2))
            if resolve:
                return self._file(resolve.group(1), resolve.group(2), resolve.group(3))
            self._json(404, {"error": "not found"})

        def _json(self, code: int, data: Any) -> None:
            body = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _listing(self, repo_id: str, rev: str) -> None:
            repo = hub.find(repo_id, rev)
            if repo is None:
                return self._json(404, {"error": "Revision Not Found"})
            siblings = []
            for f in repo.files:
                size = hub.lie.get(f.name, len(f.data))
                item: dict[str, Any] = {"rfilename": f.name, "size": size, "blobId": f.blob_id}
                if f.lfs:
                    item["lfs"] = {"sha256": f.sha256, "size": size, "pointerSize": 134}
                siblings.append(item)
            self._json(200, {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "siblings": siblings})

        def _file(self, repo_id: str, rev: str, name: str) -> None:
            repo = hub.find(repo_id, rev)
            f = next((f for f in repo.files if f.name == name), None) if repo is not None else None
            if f is None:
                return self._json(404, {"error": "Entry not found"})
            data = f.data[:-1] + bytes([f.data[-1] ^ 0xFF]) if name in hub.corrupt and f.data else f.data
            start, end = 0, len(data) - 1
            wanted = re.match(r"\Abytes=(\d+)-(\d*)\Z", self.headers.get("Range") or "")
            if wanted and hub.ranges:
                start = int(wanted.group(1))
                end = min(int(wanted.group(2)), end) if wanted.group(2) else end
                hub.starts.append((name, start))
                hub.ranges_asked.append((name, start, end))
                if start >= len(data) or end < start:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            body = data[start:end + 1]
            partial = wanted is not None and hub.ranges
            self.send_response(206 if partial and (start or end < len(data) - 1) else 200)
            if partial and (start or end < len(data) - 1):
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{f.sha256 if f.lfs else f.blob_id}"')
            self.end_headers()
            with hub._lock:
                hub.in_flight += 1
                hub.most_in_flight = max(hub.most_in_flight, hub.in_flight)
            try:
                self._send(name, body)
            finally:
                with hub._lock:
                    hub.in_flight -= 1

        def _send(self, name: str, body: bytes) -> None:
            cut = None
            if hub.cut_after is not None and hub.cuts > 0 and len(body) > hub.cut_after:
                hub.cuts -= 1
                cut = hub.cut_after
            sent, began, step = 0, time.monotonic(), 16384
            while sent < len(body):
                if cut is not None and sent >= cut:
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops mid-transfer
                    return
                end = min(sent + step, len(body), cut if cut is not None else len(body))
                # Counted before the write: a client that has read a byte must find it counted (counting after
                # raced a client that finished and asserted while this thread had not yet counted its last part).
                hub.count(name, end - sent)
                hub.last_byte_at = time.time()
                try:
                    self.wfile.write(body[sent:end])
                except OSError:
                    hub.count(name, sent - end)  # not handed over: the client had gone
                    raise
                sent = end
                if hub.rate:
                    ahead = sent / hub.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    return Handler
