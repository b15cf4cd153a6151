"""Receiving a model directory pushed from the controller (`engine.weights.push`) into the workdir (STDLIB ONLY,
Python >= 3.8).

Run on the target as a program of its own (the helper's `push` op starts it as its child; box/pushweights.py asks
for it), one JSON line in, one out, per step; the bytes themselves arrive as chunk files over the transport's bulk
put (SFTP, or the helper's `install` for small ones), each checked by its sha256 before it is appended. Layout,
under `models` (the workdir's `.deployer/models`, ours alone, never through a symlink):

    <content>/                 the directory, complete and verified (<content>: sha256 of its manifest)
    .staging-<content>/        files being received: appended chunk by chunk, resumed from their size
    .chunks-<content>/         chunk files as they arrive (each removed once appended)
    .<content>.verified.json   name -> [size, mtime_ns, inode, sha256] of each file as last verified
    .<content>.lock            one push of a content at a time on a host (a second waits)

    request   {"models", "owned_from" (the workdir), "content", "files": [{"name", "size", "sha256"}], "dry"}
    out       {"have": [{"name", "offset", "whole", "corrupt", "linked"?}], "send", "total", "free", "dir"} (dry:
              then exit)
    in/out    {"append": name, "chunk": file name, "offset", "sha256"} -> {"appended": name, "size"}
              {"seal": name}  -> {"sealed": name} | {"bad": name, "message"} (the staged file removed: send again)
              {"finish": true} -> {"done": content, "dir", "files", "total"}
    errors    {"error": kind, "message"} (kinds: disk, unsafe, request, os, missing) and exit 2

A file another content pushed here before holds (the same sha256, still as verified) is hard-linked into the
staging dir instead of sent (two versions of a model that share most shards share their disk too). A file already
in `<content>/` is whole when its size, mtime and inode are the ones recorded when it was last
hashed, else it is hashed again (a file changed on the target is found and sent again, `corrupt`). Received files
are renamed into `<content>/` only once every one is whole: a directory that is there is complete.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
import sys
import time
from typing import Any, Dict, List, Optional

from .base import UnsafePath, check_dirs, make_dirs, open_file, remove_entry, \
    try_lock
from .fetch import FetchError, say, sha256_of, size_text, unlink_missing_ok, \
    write_all
from .files import _inside

CHUNK = 1 << 20
CONTENT_RE = re.compile(r"\A[0-9a-f]{64}\Z")
PART_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,128}\Z")
RECORD_RE = re.compile(r"\A\.([0-9a-f]{64})\.verified\.json\Z")


def _name(raw: Any) -> str:
    name = str(raw)
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in name \
            or "\n" in name or len(name) > 1024:
        raise FetchError("request", "a file name deployer will not write: %r" % (name,))
    return name


class Receive:
    """One content pushed into one models dir."""

    def __init__(self, req: Dict[str, Any]) -> None:
        self.models, self.owned_from = os.path.abspath(str(req["models"])), os.path.abspath(str(req["owned_from"]))
        self.content = str(req["content"])
        if not CONTENT_RE.match(self.content):
            raise FetchError("request", "%r is not a content hash" % self.content)
        self.files: List[Dict[str, Any]] = [{"name": _name(f["name"]), "size": int(f["size"]), "sha256": str(f["sha256"])}
                      for f in req["files"]]
        self.dry = bool(req.get("dry"))
        self.final = os.path.join(self.models, self.content)
        self.staging = os.path.join(self.models, ".staging-" + self.content)
        self.chunks = os.path.join(self.models, ".chunks-" + self.content)
        self.record_path = os.path.join(self.models, ".%s.verified.json" % self.content)
        self.record: Dict[str, List[Any]] = {}
        self.whole: Dict[str, bool] = {}
        self.elsewhere: Dict[str, str] = {}

    def run(self) -> int:
        if self.dry and not os.path.lexists(self.models):  # `deploy plan` writes nothing: all of it to send
            check_dirs(self.models, self.owned_from)
            where = self.models
            while not os.path.exists(where):
                where = os.path.dirname(where)
            st, total = os.statvfs(where), sum(f["size"] for f in self.files)
            say({"have": [{"name": f["name"], "offset": 0, "whole": False, "corrupt": False} for f in self.files],
                 "send": total, "total": total, "free": st.f_bavail * st.f_frsize, "dir": self.final})
            return 0
        make_dirs(self.models, self.owned_from)
        lock = open_file(os.path.join(self.models, ".%s.lock" % self.content), os.O_RDWR | os.O_CREAT, 0o600,
                         "push lock")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                say({"waiting": "another push of %s on this host" % self.content[:12]})
                fcntl.flock(lock, fcntl.LOCK_EX)
            return self._locked()
        finally:
            os.close(lock)

    def _locked(self) -> int:
        self.record = self._read_record(self.record_path)
        self.elsewhere = self._verified_elsewhere()
        have = [self._state(f) for f in self.files]
        total = sum(f["size"] for f in self.files)
        send = sum(f["size"] - h["offset"] for f, h in zip(self.files, have) if not h["whole"])
        st = os.statvfs(self.models)
        free = st.f_bavail * st.f_frsize
        if not self.dry and send <= free:  # before the answer: the chunks are put there right after it
            for sub in (self.staging, self.chunks):
                make_dirs(sub, self.models)
        say({"have": have, "send": send, "total": total, "free": free, "dir": self.final})
        if self.dry:
            return 0
        if send > free:
            raise FetchError("disk", "%s needs %s more under %s, which has %s free" % (
                self.content[:12], size_text(send), self.models, size_text(free)))
        while True:
            line = sys.stdin.readline()
            if not line:
                return 3  # the controller went away: what arrived stays staged for the next push
            req = json.loads(line)
            if req.get("finish"):
                say(self._finish())
                return 0
            say(self._append(req) if "append" in req else self._seal(str(req["seal"])))

    # -- what is there ------------------------------------------------------------------------------------

    def _read_record(self, path: str) -> Dict[str, List[Any]]:
        try:
            fd = open_file(path, os.O_RDONLY, 0o600, "verification record")
        except OSError:
            return {}
        try:
            data = json.loads(os.read(fd, 1 << 24).decode("utf-8"))
        except ValueError:
            return {}
        finally:
            os.close(fd)
        return data if isinstance(data, dict) else {}

    def _verified_elsewhere(self) -> Dict[str, str]:
        """sha256 -> a file of another content pushed here before, still as it was when verified (size, mtime,
        inode): a file two versions share is linked, not sent again."""
        found: Dict[str, str] = {}
        for entry in sorted(os.listdir(self.models)):
            other = RECORD_RE.match(entry)
            if other is None or other.group(1) == self.content:
                continue
            for name, kept in self._read_record(os.path.join(self.models, entry)).items():
                if not isinstance(kept, list) or len(kept) != 4:
                    continue  # a record deployer did not write: nothing in it is believed
                path = os.path.join(self.models, other.group(1), name)
                try:
                    _name(name)
                    _inside(path, self.models)
                    st = os.lstat(path)
                except (FetchError, UnsafePath, OSError):
                    continue
                if stat.S_ISREG(st.st_mode) and kept[:3] == [st.st_size, st.st_mtime_ns, st.st_ino]:
                    found.setdefault(str(kept[3]), path)
        return found

    def _linked(self, f: Dict[str, Any], staged: str) -> bool:
        """The file staged as a hard link to the same bytes of another content (False: none, or no link here)."""
        source = self.elsewhere.get(f["sha256"])
        if source is None:
            return False
        make_dirs(os.path.dirname(staged), self.models)
        _inside(staged, self.models)
        try:
            os.link(source, staged)
        except OSError:
            return False  # another file system, links not allowed: sent as usual
        return True

    def _state(self, f: Dict[str, Any]) -> Dict[str, Any]:
        """Whole in the final dir (recorded, or hashed again), else how much of it is staged."""
        name, corrupt = f["name"], False
        done = os.path.join(self.final, name)
        if os.path.lexists(done):
            _inside(done, self.models)
            if self._verified(done, f):
                self.whole[name] = True
                return {"name": name, "offset": f["size"], "whole": True, "corrupt": False}
            corrupt = True
        staged = os.path.join(self.staging, name)
        offset = 0
        if os.path.lexists(staged):
            _inside(staged, self.models)
            size = os.lstat(staged).st_size
            offset = size if stat.S_ISREG(os.lstat(staged).st_mode) and size <= f["size"] else 0
            if offset == 0:
                unlink_missing_ok(staged)
        if offset == 0 and f["sha256"] in self.elsewhere and (self.dry or self._linked(f, staged)):
            self.whole[name] = True
            return {"name": name, "offset": f["size"], "whole": True, "corrupt": corrupt, "linked": True}
        self.whole[name] = False
        return {"name": name, "offset": offset, "whole": False, "corrupt": corrupt}

    def _verified(self, path: str, f: Dict[str, Any]) -> bool:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != f["size"]:
            return False
        if self.record.get(f["name"]) == [st.st_size, st.st_mtime_ns, st.st_ino, f["sha256"]]:
            return True
        digest, st = sha256_of(path)
        if digest != f["sha256"]:
            return False
        self.record[f["name"]] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]
        return True

    # -- receiving ----------------------------------------------------------------------------------------

    def _listed(self, name: str) -> Dict[str, Any]:
        for f in self.files:
            if f["name"] == name:
                return f
        raise FetchError("request", "%r is not a file of this push" % name)

    def _append(self, req: Dict[str, Any]) -> Dict[str, Any]:
        f, part = self._listed(str(req["append"])), str(req["chunk"])
        if not PART_RE.match(part) or part.startswith("."):
            raise FetchError("request", "a bad chunk name %r" % part)
        chunk = os.path.join(self.chunks, part)
        digest, _ = sha256_of(chunk)
        if digest != req["sha256"]:
            unlink_missing_ok(chunk)
            return {"bad": f["name"], "message": "a chunk of %s arrived damaged" % f["name"]}
        staged = os.path.join(self.staging, f["name"])
        make_dirs(os.path.dirname(staged), self.models)
        _inside(staged, self.models)
        fd = open_file(staged, os.O_WRONLY | os.O_CREAT, 0o644, "staged model file")
        try:
            offset = int(req["offset"])
            if os.fstat(fd).st_size < offset:
                raise FetchError("request", "%s: a chunk for offset %d, but %d bytes are staged" % (
                    f["name"], offset, os.fstat(fd).st_size))
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            src = open_file(chunk, os.O_RDONLY, 0o600, "chunk")
            try:
                while True:
                    data = os.read(src, CHUNK)
                    if not data:
                        break
                    write_all(fd, data, f["name"])
            finally:
                os.close(src)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        unlink_missing_ok(chunk)
        if size > f["size"]:
            raise FetchError("request", "%s: %d bytes staged, more than its %d" % (f["name"], size, f["size"]))
        return {"appended": f["name"], "size": size}

    def _seal(self, name: str) -> Dict[str, Any]:
        """The staged file checked whole (size, sha256) and fsynced; else removed, to be sent again."""
        f = self._listed(name)
        staged = os.path.join(self.staging, name)
        _inside(staged, self.models)
        try:
            digest, st = sha256_of(staged)
        except FileNotFoundError:
            return {"bad": name, "message": "%s: nothing staged" % name}
        if st.st_size != f["size"] or digest != f["sha256"]:
            unlink_missing_ok(staged)
            return {"bad": name, "message": "%s: %d bytes with sha256 %s staged, %d with %s sent; removed" % (
                name, st.st_size, digest[:12], f["size"], f["sha256"][:12])}
        fd = open_file(staged, os.O_RDONLY, 0o644, "staged model file")
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.whole[name] = True
        return {"sealed": name}

    def _finish(self) -> Dict[str, Any]:
        missing = [f["name"] for f in self.files if not self.whole.get(f["name"])]
        if missing:
            raise FetchError("missing", "%d file(s) not received whole, e.g. %s" % (len(missing), missing[0]))
        if not os.path.lexists(self.final):
            for f in self.files:  # a file staged for nothing (an earlier push's) does not travel
                if not os.path.lexists(os.path.join(self.staging, f["name"])):
                    raise FetchError("missing", "%s is not staged" % f["name"])
            os.rename(self.staging, self.final)
        else:
            _inside(os.path.join(self.final, "x"), self.models)
            for f in self.files:
                staged = os.path.join(self.staging, f["name"])
                if os.path.lexists(staged):
                    done = os.path.join(self.final, f["name"])
                    make_dirs(os.path.dirname(done), self.models)
                    _inside(done, self.models)
                    os.replace(staged, done)
            shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self.chunks, ignore_errors=True)
        self._keep_record()
        return {"done": self.content, "dir": self.final, "files": len(self.files),
                "total": sum(f["size"] for f in self.files)}

    def _keep_record(self) -> None:
        """Every file is verified now (hashed here or sealed; a rename keeps inode and mtime): recorded as it is."""
        for f in self.files:
            st = os.lstat(os.path.join(self.final, f["name"]))
            self.record[f["name"]] = [st.st_size, st.st_mtime_ns, st.st_ino, f["sha256"]]
        tmp = self.record_path + ".tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, "verification record")
        try:
            write_all(fd, json.dumps(self.record).encode(), "verification record")
        finally:
            os.close(fd)
        os.rename(tmp, self.record_path)


# -- retention (the helper's `models_prune`) -------------------------------------------------------------------

def models_prune(req: Dict[str, Any]) -> Dict[str, Any]:
    """Retention of the pushed directories under `models` (the workdir `owned_from`'s): each content no kept run
    of a deployment there loads (its profile.json; `going`: run dirs, relative to the workdir, not to count),
    last pushed or reused more than `min_age_s` ago and not being pushed now (its lock is free), goes with its
    staging, chunks and record; `dry`: only said. Never through a symlink: `models` must be a directory of ours,
    and what goes is removed without following a link in it. A run record that cannot be read removes nothing."""
    models, owned_from = os.path.abspath(str(req["models"])), os.path.abspath(str(req["owned_from"]))
    min_age, dry = float(req.get("min_age_s") or 0.0), bool(req.get("dry"))
    if not os.path.lexists(models):
        return {"removed": [], "bytes": 0, "recent": [], "busy": []}
    check_dirs(models, owned_from)
    if not stat.S_ISDIR(os.lstat(models).st_mode):
        raise UnsafePath("%s is not a directory (a symbolic link?): refused" % models)
    keep = _loaded(owned_from, models, set(str(g) for g in req.get("going") or ()))
    removed: List[str] = []
    recent: List[str] = []
    busy: List[str] = []
    freed = 0
    for content in _contents(models):
        if content in keep:
            continue
        lock = try_lock(os.path.join(models, ".%s.lock" % content))
        if lock is None:
            busy.append(content)  # a push of it runs now
            continue
        try:
            places = _places(models, content)
            if time.time() - max(os.lstat(p).st_mtime for p in places) < min_age:
                recent.append(content)
                continue
            freed += sum(_bytes(p) for p in places)
            if not dry:
                for path in places:  # the record first: no push believes (and links) a file of a content that goes
                    remove_entry(path)
            removed.append(content)
        finally:
            os.close(lock)
    return {"removed": removed, "bytes": freed, "recent": recent, "busy": busy}


def _loaded(workdir: str, models: str, going: "set[str]") -> "set[str]":
    """The contents the runs under `workdir` (`<name>/runs/<id>/profile.json`) load, but those `going`."""
    loaded: "set[str]" = set()
    for name in sorted(os.listdir(workdir)):
        runs = os.path.join(workdir, name, "runs")
        if name.startswith(".") or not os.path.isdir(runs) or os.path.islink(os.path.join(workdir, name)):
            continue
        for run in sorted(os.listdir(runs)):
            if "%s/runs/%s" % (name, run) in going:
                continue
            path = os.path.join(runs, run, "profile.json")
            if not os.path.lexists(path):
                continue  # a run dir still being written has its files pushed before it is used
            try:
                fd = open_file(path, os.O_RDONLY, 0o600, "run record")
                try:
                    text = b"".join(iter(lambda: os.read(fd, 1 << 20), b"")).decode("utf-8")
                finally:
                    os.close(fd)
            except (OSError, UnsafePath, UnicodeDecodeError) as e:
                raise FetchError("os", "cannot read %s (%s): no pushed model directory removed" % (path, e)) \
                    from None
            loaded.update(m.group(1) for m in re.finditer(re.escape(models) + r"/([0-9a-f]{64})", text))
    return loaded


def _contents(models: str) -> List[str]:
    found = set()
    for name in os.listdir(models):
        record = RECORD_RE.match(name)
        bare = name.split("-", 1)[1] if name.startswith((".staging-", ".chunks-")) else name
        if record is not None:
            found.add(record.group(1))
        elif CONTENT_RE.match(bare):
            found.add(bare)
    return sorted(found)


def _places(models: str, content: str) -> List[str]:
    """What a content has under `models`, its record first (the lock file stays: a waiting push may hold it open)."""
    names = (".%s.verified.json" % content, content, ".staging-" + content, ".chunks-" + content)
    return [os.path.join(models, n) for n in names if os.path.lexists(os.path.join(models, n))]


def _bytes(path: str) -> int:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else 0
    total = 0
    for top, _, files in os.walk(path):  # os.walk follows no symlink to a directory
        for name in files:
            total += _bytes(os.path.join(top, name))
    return total


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return Receive(json.loads(sys.stdin.readline())).run()
    except FetchError as e:
        say({"error": e.kind, "message": str(e)})
    except UnsafePath as e:
        say({"error": "unsafe", "message": str(e)})
    except (ValueError, KeyError, TypeError) as e:
        say({"error": "request", "message": "a bad push request: %s" % e})
    except OSError as e:
        kind = "disk" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
        say({"error": kind, "message": "%s: %s" % (getattr(e, "filename", None) or "push", e.strerror or e)})
    return 2


if __name__ == "__main__":
    sys.exit(main())
