"""Fetching a model repository from the hub's HTTP file API into the target's hub cache (STDLIB ONLY, Python >= 3.8).

Run on the target as a program of its own (the helper's `fetch` op starts it as its child: protocol.Op;
deployer/box/weights.py asks for it); one JSON request on stdin (the token travels there, never in argv), JSON
lines out:

    request   {"endpoint", "repo", "revision", "hub" (null: HF_HUB_CACHE / HF_HOME/hub / ~/.cache/huggingface/hub),
               "token" (null: the target's HF_TOKEN), "progress_s", "dry" (true: the `listed` line only)}
    out       {"listed": sha, "files", "total", "missing", "free"}, then {"file", "bytes", "total", "rate"} every
              progress_s, then {"done": sha, "fetched", "files", "total", "snapshot"} or {"error": kind, "message"}

The API: `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true` names the commit (`sha`) and its files
(`siblings`: `rfilename`, `size`, `blobId`, `lfs.sha256`); each file is `GET {endpoint}/{repo}/resolve/{sha}/{file}`.
The layout is the one huggingface_hub reads offline: `models--ORG--NAME/blobs/<lfs sha256 or git blob id>`, its
`.incomplete` while it downloads (resumed with an HTTP Range), `snapshots/<sha>/<file>` a relative symlink to the
blob, `refs/<rev>` the commit a branch or tag named. Every file is checked against the listed size (and an LFS
file against its sha256) before it is linked; the free disk against what is missing before anything is fetched.
One fetch per model at a time on a host (a lock file beside the model's folder): a second one waits, then finds
the files there.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

from .base import UnsafePath, make_dirs, open_file

CHUNK = 1 << 20
PART = 64 << 20           # a file of two parts or more comes in parts at once (Parts), when asked for connections
MAX_CONNECTIONS = 32
TRIES = 3                 # per file: a dropped connection is resumed from what arrived, this many times in all
TIMEOUT_S = 60.0          # per socket read
SHA_RE = re.compile(r"\A[0-9a-f]{40}\Z")
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
REV_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*\Z")  # no `..`: refs/<rev>
BLOB_RE = re.compile(r"\A[0-9a-f]{40,64}\Z")


class FetchError(Exception):
    """One line for the person, and a kind the controller maps to an error (disk, size, sha256, http, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def say(data: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def hub_dir(asked: Optional[str]) -> str:
    """The hub cache huggingface_hub reads: as asked, else HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub."""
    env = os.environ
    path = asked or env.get("HF_HUB_CACHE") or (os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else
                                                 os.path.join("~", ".cache", "huggingface", "hub"))
    return os.path.abspath(os.path.expanduser(path))


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed (the hub sends LFS files to its CDN), the token never sent on to another host."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


OPENER = urllib.request.build_opener(_Redirects)


def _get(url: str, token: Optional[str], start: int = 0, last: Optional[int] = None) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "deployer-fetch"})
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if start or last is not None:
        req.add_header("Range", "bytes=%d-%s" % (start, "" if last is None else last))
    try:
        return OPENER.open(req, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:
            return None  # nothing after `start`: the partial file is already whole (or longer: checked after)
        hint = {401: " (a private or gated repo: set HF_TOKEN)", 403: " (no access: accept the licence, "
                "check HF_TOKEN)", 404: " (no such repo, revision or file)"}.get(e.code, "")
        raise FetchError("http", "%s answered HTTP %d%s" % (_safe(url), e.code, hint)) from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        raise FetchError("unreachable", "cannot reach %s: %s" % (_safe(url), why)) from None


def _safe(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return "%s://%s%s" % (parts.scheme, parts.netloc, parts.path)


def listing(endpoint: str, repo: str, revision: str, token: Optional[str]) -> Dict[str, Any]:
    """The commit a revision names and its files (name, size, blob name, sha256 of LFS files)."""
    url = "%s/api/models/%s/revision/%s?blobs=true" % (endpoint, repo, urllib.parse.quote(revision, safe=""))
    with _get(url, token) as resp:
        try:
            data = json.loads(resp.read().decode("utf-8"))
        except ValueError:
            raise FetchError("http", "%s did not answer JSON" % _safe(url)) from None
    sha = data.get("sha") if isinstance(data, dict) else None
    if not isinstance(sha, str) or not SHA_RE.match(sha):
        raise FetchError("http", "%s named no commit" % _safe(url))
    files = []
    for s in data.get("siblings") or []:
        files.append(_sibling(s))
    return {"sha": sha, "files": files}


def _sibling(s: Any) -> Dict[str, Any]:
    name = s.get("rfilename") if isinstance(s, dict) else None
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        raise FetchError("listing", "the hub listed a file name deployer will not write: %r" % (name,))
    lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else None
    size = (lfs or {}).get("size", s.get("size"))
    blob = (lfs or {}).get("sha256") or s.get("blobId")
    if not isinstance(size, int) or size < 0 or not isinstance(blob, str) or not BLOB_RE.match(blob):
        raise FetchError("listing", "the hub listed %s without a size and blob id (is it the hub's file API?)"
                         % name)
    return {"name": name, "size": size, "blob": blob, "sha256": (lfs or {}).get("sha256")}


class Fetch:
    """One repo's revision into one hub cache folder."""

    def __init__(self, req: Dict[str, Any]) -> None:
        endpoint = req.get("endpoint") or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        self.endpoint = str(endpoint).rstrip("/")
        self.repo, self.revision = str(req["repo"]), str(req.get("revision") or "main")
        if not NAME_RE.match(self.repo):
            raise FetchError("listing", "%r is not a hub repo id (org/name)" % self.repo)
        if not REV_RE.match(self.revision) or len(self.revision) > 200:
            raise FetchError("listing", "%r is not a revision (a branch, tag or commit)" % self.revision)
        self.token = req.get("token") or os.environ.get("HF_TOKEN") or None
        self.hub = hub_dir(req.get("hub"))
        self.folder = os.path.join(self.hub, "models--" + self.repo.replace("/", "--"))
        self.every = float(req.get("progress_s") or 1.0)
        self.connections = max(1, min(int(req.get("connections") or 1), MAX_CONNECTIONS))
        self.part = max(int(req.get("part_bytes") or PART), 1 << 16)
        self.lock = threading.Lock()  # the counters below, when parts of a file come at once
        self.dry = bool(req.get("dry"))  # `deploy plan`: say what is missing and the free disk, fetch nothing
        self.fetched = 0      # bytes that came over the network in this fetch
        self.done = 0         # bytes of the revision on disk (complete or partial)
        self.total = 0
        self.began = time.monotonic()
        self.last = (0.0, 0)  # when progress was last said, self.fetched then

    def run(self) -> int:
        make_dirs(os.path.join(self.hub, ".locks"), self.hub)
        lock = open_file(os.path.join(self.hub, ".locks", os.path.basename(self.folder) + ".deployer.lock"),
                         os.O_RDWR | os.O_CREAT, 0o600, "fetch lock")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                say({"waiting": "another fetch of %s on this host" % self.repo})
                fcntl.flock(lock, fcntl.LOCK_EX)
            return self._locked()
        finally:
            os.close(lock)

    def _locked(self) -> int:
        kept = self._manifest() if SHA_RE.match(self.revision) else None
        listed = kept or listing(self.endpoint, self.repo, self.revision, self.token)
        sha, files = listed["sha"], listed["files"]
        for sub in ("blobs", os.path.join("snapshots", sha), "refs"):
            make_dirs(os.path.join(self.folder, sub), self.hub)
        self.total = sum(f["size"] for f in files)
        have = {f["name"]: self._have(f) for f in files}
        self.done = sum(have.values())
        missing = self.total - self.done
        st = os.statvfs(self.hub)
        free = st.f_bavail * st.f_frsize
        say({"listed": sha, "files": len(files), "total": self.total, "missing": missing, "free": free})
        if self.dry:
            return 0
        if missing > free:
            raise FetchError("disk", "%s@%s needs %s more on %s, which has %s free" % (
                self.repo, sha[:12], size_text(missing), self.hub, size_text(free)))
        for f in files:
            if have[f["name"]] < f["size"] or not os.path.exists(self._blob(f)):
                self._file(sha, f)
            self._link(sha, f)
        if self.revision != sha:
            self._ref(sha)
        if kept is None:
            self._keep(listed)
        self._progress("", force=True)
        say({"done": sha, "fetched": self.fetched, "files": len(files), "total": self.total,
             "snapshot": os.path.join(self.folder, "snapshots", sha)})
        return 0

    def _manifest_path(self, sha: str) -> str:
        """Where a complete fetch's listing is kept: under `.locks/`, which huggingface_hub's cache scan skips."""
        return os.path.join(self.hub, ".locks", os.path.basename(self.folder), "deployer-%s.json" % sha)

    def _manifest(self) -> Optional[Dict[str, Any]]:
        """The listing of a commit fetched completely before (a pinned revision, a rollback): used without asking
        the hub when every file it names is still here whole; None otherwise."""
        try:
            fd = open_file(self._manifest_path(self.revision), os.O_RDONLY, 0o600, "fetch manifest")
        except OSError:
            return None
        try:
            data = json.loads(os.read(fd, 1 << 24).decode("utf-8"))
            files = [_sibling({"rfilename": f["name"], "size": f["size"], "blobId": f["blob"],
                               "lfs": {"sha256": f["sha256"], "size": f["size"]} if f.get("sha256") else None})
                     for f in data["files"]]
        except (ValueError, KeyError, TypeError, FetchError):
            return None
        finally:
            os.close(fd)
        if data.get("sha") != self.revision or any(self._have(f) != f["size"] or not os.path.exists(self._blob(f))
                                                   for f in files):
            return None
        return {"sha": self.revision, "files": files}

    def _keep(self, listed: Dict[str, Any]) -> None:
        path = self._manifest_path(listed["sha"])
        make_dirs(os.path.dirname(path), self.hub)
        tmp = path + ".tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, "fetch manifest")
        try:
            write_all(fd, json.dumps(listed).encode(), "fetch manifest")
        finally:
            os.close(fd)
        os.rename(tmp, path)

    def _blob(self, f: Dict[str, Any]) -> str:
        return os.path.join(self.folder, "blobs", f["blob"])

    def _have(self, f: Dict[str, Any]) -> int:
        """Bytes of the file already here: the whole blob, else its partial download (never more than listed)."""
        parts = Parts.done_of(self._blob(f), f["size"])
        if parts is not None:
            return parts
        for path in (self._blob(f), self._blob(f) + ".incomplete"):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if path.endswith(".incomplete") or st.st_size == f["size"]:
                return int(min(st.st_size, f["size"]))
        return 0

    def _file(self, sha: str, f: Dict[str, Any]) -> None:
        """Download one file into its .incomplete (resumed from what is there), check it, rename it into place; a
        large one in parts at once when the hub answers ranges (Parts)."""
        part = self._blob(f) + ".incomplete"
        url = "%s/%s/resolve/%s/%s" % (self.endpoint, self.repo, sha, urllib.parse.quote(f["name"]))
        parted = Parts.done_of(self._blob(f), f["size"]) is not None  # a parted download to resume
        if (parted or self.connections > 1 and f["size"] >= 2 * self.part and not os.path.lexists(part)) and \
                Parts(self, url, f).run():
            return
        retry_cuts(lambda: self._transfer(url, part, f))
        self._check(part, f)
        os.rename(part, self._blob(f))

    def _transfer(self, url: str, part: str, f: Dict[str, Any]) -> None:
        fd = open_file(part, os.O_WRONLY | os.O_CREAT, 0o644, "partial download")
        try:
            start = os.fstat(fd).st_size
            if start > f["size"]:
                os.ftruncate(fd, 0)
                self.done -= f["size"]
                start = 0
            resp = _get(url, self.token, start) if start < f["size"] or start == 0 else None
            if resp is None:
                return
            with resp:
                if start and resp.status != 206:  # the server sent the whole file: start over
                    os.ftruncate(fd, 0)
                    self.done -= start
                    start = 0
                os.lseek(fd, start, os.SEEK_SET)
                self._copy(resp, fd, f, start)
        finally:
            os.close(fd)

    def _copy(self, resp: Any, fd: int, f: Dict[str, Any], start: int) -> None:
        got = start
        while True:
            try:
                chunk = resp.read(min(CHUNK, f["size"] + 1 - got))
            except Exception as e:  # a reset socket, a timeout, http.client.IncompleteRead
                raise FetchError("cut", "the transfer of %s broke off: %s" % (f["name"], e)) from None
            if not chunk:
                break
            write_all(fd, chunk, f["name"])
            got += len(chunk)
            self.fetched += len(chunk)
            self.done += len(chunk)
            if got > f["size"]:
                raise FetchError("size", "%s: the hub listed %d bytes but sent more; refused (a listing that does "
                                 "not match its files)" % (f["name"], f["size"]))
            self._progress(f["name"])
        if got < f["size"]:
            raise FetchError("cut", "the transfer of %s broke off at %d of %d bytes" % (f["name"], got, f["size"]))

    def _check(self, part: str, f: Dict[str, Any]) -> None:
        size = os.lstat(part).st_size
        if size != f["size"]:
            os.unlink(part)
            raise FetchError("size", "%s: the hub listed %d bytes but the file has %d; refused" % (
                f["name"], f["size"], size))
        if f["sha256"]:
            if sha256_of(part, "downloaded file")[0] != f["sha256"]:
                os.unlink(part)
                raise FetchError("sha256", "%s: its sha256 is not the one the hub listed; refused (removed)"
                                 % f["name"])

    def _link(self, sha: str, f: Dict[str, Any]) -> None:
        """snapshots/<sha>/<name> -> ../../blobs/<blob> (relative, as huggingface_hub makes it)."""
        link = os.path.join(self.folder, "snapshots", sha, f["name"])
        make_dirs(os.path.dirname(link), self.hub)
        depth = f["name"].count("/")
        target = os.path.join(*([".."] * (2 + depth)), "blobs", f["blob"])
        try:
            if os.readlink(link) == target:
                return
            os.unlink(link)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINVAL):
                raise
            if e.errno == errno.EINVAL:  # a regular file where the link goes: not ours to keep
                os.unlink(link)
        os.symlink(target, link)

    def _ref(self, sha: str) -> None:
        ref = os.path.join(self.folder, "refs", self.revision)
        make_dirs(os.path.dirname(ref), self.hub)
        tmp = ref + ".deployer-tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, "ref")
        try:
            write_all(fd, sha.encode(), "ref")
        finally:
            os.close(fd)
        os.rename(tmp, ref)

    def count(self, n: int, name: str) -> None:
        with self.lock:
            self.fetched += n
            self.done += n
            self._progress(name)

    def _progress(self, name: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last[0] < self.every:
            return
        span = now - self.last[0] if self.last[0] else now - self.began
        rate = int((self.fetched - self.last[1]) / span) if span > 0 else 0
        self.last = (now, self.fetched)
        say({"file": name, "bytes": self.done, "total": self.total, "rate": rate, "fetched": self.fetched})


class Parts:
    """One large file downloaded in parts at once (what hf_transfer does for huggingface_hub, in the stdlib): part
    k is bytes [k*part, (k+1)*part) asked with its own `Range`, up to `connections` at a time, each written where it
    belongs in `<blob>.deployer-parts` (not `.incomplete`: huggingface_hub resumes that one from its size, which a
    file with holes would make wrong). How much of each part has arrived is kept beside it (`.json`, saved every
    few MB and when the fetch ends), so a broken fetch resumes every part where it stopped. A hub that ignores
    Range (200 to the first part's request) gets the file in one stream instead."""

    SAVE_EVERY = 8 << 20

    def __init__(self, fetch: Fetch, url: str, f: Dict[str, Any]) -> None:
        self.fetch, self.url, self.f = fetch, url, f
        self.path = fetch._blob(f) + ".deployer-parts"
        self.size, self.part = int(f["size"]), fetch.part
        self.parts = -(-self.size // self.part)
        self.got = self._kept() or [0] * self.parts
        self.todo = [k for k in range(self.parts) if self.got[k] < self._length(k)]
        self.failed: Optional[BaseException] = None
        self.unsaved = 0

    @staticmethod
    def done_of(blob: str, size: int) -> Optional[int]:
        """Bytes of a parted download already here (None: there is none)."""
        try:
            fd = open_file(blob + ".deployer-parts.json", os.O_RDONLY, 0o644, "parts record")
        except OSError:
            return None
        try:
            data = json.loads(os.read(fd, 1 << 20).decode("utf-8"))
            return min(sum(int(n) for n in data["got"]), size) if data.get("size") == size else None
        except (ValueError, KeyError, TypeError):
            return None
        finally:
            os.close(fd)

    def _kept(self) -> Optional[List[int]]:
        try:
            fd = open_file(self.path + ".json", os.O_RDONLY, 0o644, "parts record")
        except OSError:
            return None
        try:
            data = json.loads(os.read(fd, 1 << 20).decode("utf-8"))
        except ValueError:
            return None
        finally:
            os.close(fd)
        got = data.get("got") if isinstance(data, dict) else None
        if data.get("size") != self.size or data.get("part") != self.part or not isinstance(got, list) or \
                len(got) != self.parts or not os.path.lexists(self.path):
            return None
        return [max(0, min(int(n), self._length(k))) for k, n in enumerate(got)]

    def _length(self, k: int) -> int:
        return min(self.part, self.size - k * self.part)

    def _save(self) -> None:
        tmp = self.path + ".json.tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, "parts record")
        try:
            write_all(fd, json.dumps({"size": self.size, "part": self.part, "got": self.got}).encode(),
                       "parts record")
        finally:
            os.close(fd)
        os.rename(tmp, self.path + ".json")

    def run(self) -> bool:
        """The file whole, checked and in place (True), or False when the hub does not answer ranges."""
        fd = open_file(self.path, os.O_RDWR | os.O_CREAT, 0o644, "partial download")
        try:
            if self.todo and not self._first(fd):
                os.close(fd)
                fd = -1
                self._drop()
                return False
            workers = [threading.Thread(target=self._work, args=(fd,), daemon=True)
                       for _ in range(min(self.fetch.connections, len(self.todo)))]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            if fd >= 0:
                os.close(fd)
                self._save()
        if self.failed is not None:
            raise self.failed
        self.fetch._check(self.path, self.f)  # removes the file when it does not match: all parts come again
        os.rename(self.path, self.fetch._blob(self.f))
        unlink_missing_ok(self.path + ".json")
        return True

    def _first(self, fd: int) -> bool:
        """The first missing part, asked before the others: False when the hub sends the whole file (no ranges)."""
        k = self.todo.pop(0)
        start = k * self.part + self.got[k]
        resp = _get(self.url, self.fetch.token, start, k * self.part + self._length(k) - 1)
        if resp is None:
            self.got[k] = self._length(k)
            return True
        with resp:
            if resp.status != 206:
                return False
            try:
                self._copy(resp, fd, k)
            except FetchError as e:
                if e.kind != "cut":
                    raise
                self.todo.append(k)  # what arrived is kept; the rest with the others
        return True

    def _drop(self) -> None:
        for path in (self.path, self.path + ".json"):
            unlink_missing_ok(path)

    def _work(self, fd: int) -> None:
        while self.failed is None:
            with self.fetch.lock:
                if not self.todo:
                    return
                k = self.todo.pop(0)
            try:
                self._part(fd, k)
            except BaseException as e:  # noqa: BLE001 (said once every worker ended)
                with self.fetch.lock:
                    self.failed = self.failed or e

    def _part(self, fd: int, k: int) -> None:
        retry_cuts(lambda: self._part_from_where_it_is(fd, k))

    def _part_from_where_it_is(self, fd: int, k: int) -> None:
        start, last = k * self.part + self.got[k], k * self.part + self._length(k) - 1
        if start > last:
            return
        resp = _get(self.url, self.fetch.token, start, last)
        if resp is None:
            return
        with resp:
            if resp.status != 206:
                raise FetchError("http", "%s: the hub answered a range with the whole file" % self.f["name"])
            self._copy(resp, fd, k)

    def _copy(self, resp: Any, fd: int, k: int) -> None:
        length = self._length(k)
        while self.got[k] < length and self.failed is None:
            try:
                chunk = resp.read(min(CHUNK, length - self.got[k]))
            except Exception as e:  # a reset socket, a timeout, http.client.IncompleteRead
                raise FetchError("cut", "the transfer of %s broke off: %s" % (self.f["name"], e)) from None
            if not chunk:
                raise FetchError("cut", "the transfer of %s broke off in part %d" % (self.f["name"], k))
            _pwrite_all(fd, chunk, k * self.part + self.got[k], self.f["name"])
            with self.fetch.lock:
                self.got[k] += len(chunk)
                self.unsaved += len(chunk)
                if self.unsaved >= self.SAVE_EVERY:
                    self.unsaved = 0
                    self._save()
            self.fetch.count(len(chunk), self.f["name"])


def retry_cuts(transfer: Callable[[], None]) -> None:
    """`transfer()`, again after it broke off (it resumes from what it wrote), TRIES times in all; any other
    failure, or the last cut, is raised."""
    for attempt in range(1, TRIES + 1):
        try:
            transfer()
            return
        except FetchError as e:
            if e.kind != "cut" or attempt == TRIES:
                raise


def sha256_of(path: str, what: str = "file") -> Tuple[str, os.stat_result]:
    """The file's sha256 and its stat (read through open_file: never a symlink, only a regular file of ours)."""
    fd = open_file(path, os.O_RDONLY, 0o644, what)
    try:
        st, digest = os.fstat(fd), hashlib.sha256()
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                return digest.hexdigest(), st
            digest.update(chunk)
    finally:
        os.close(fd)


def unlink_missing_ok(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _pwrite_all(fd: int, data: bytes, offset: int, what: str) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.pwrite(fd, view, offset)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise FetchError("disk", "the disk filled while writing %s" % what) from None
            raise
        view, offset = view[n:], offset + n


def write_all(fd: int, data: bytes, what: str) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise FetchError("disk", "the disk filled while writing %s" % what) from None
            raise
        view = view[n:]


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1000.0
    return "%d B" % n


def _end_with_the_caller() -> None:
    """The caller went away (Ctrl-C, a dropped connection): its stdin ends, and so does this fetch, at once (what
    arrived stays in the .incomplete file for the next one; the lock goes with the process)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    os._exit(3)


def main(argv: Optional[List[str]] = None) -> int:
    """The program's entry: it ends here, through _exit, whatever happened."""
    code = _serve()
    _exit(code)
    return code


def _serve() -> int:
    line = sys.stdin.readline()
    threading.Thread(target=_end_with_the_caller, name="caller", daemon=True).start()
    try:
        req = json.loads(line)
        return Fetch(req).run()
    except FetchError as e:
        say({"error": e.kind, "message": str(e)})
    except UnsafePath as e:
        say({"error": "unsafe", "message": str(e)})
    except (ValueError, KeyError) as e:
        say({"error": "request", "message": "a bad fetch request: %s" % e})
    except OSError as e:
        kind = "disk" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
        say({"error": kind, "message": "%s: %s" % (getattr(e, "filename", None) or "fetch", e.strerror or e)})
    return 2


def _exit(code: int) -> None:
    """End now, output flushed: not through the interpreter's shutdown, which aborts ("could not acquire lock for
    <stdin>") while the caller thread is blocked reading stdin."""
    try:
        sys.stdout.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
