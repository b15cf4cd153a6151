"""The helper's `env_build` op: build a managed engine environment under `<workdir>/.deployer/envs/`, once per host,
published atomically (deployer/prepare/install_plan.py's LOCK_PROTOCOL; the client is deployer/prepare/environment.py).

Stdlib only, Python >= 3.8. One request does the whole protocol, so the build lock is never held across a dropped
connection:

    env_build {root, owned_from, digest, build_id, steps: [{name, argv, env}], record, timeout}
        1. `root` (the envs dir) made if missing, refused (kind `unsafe`) when a directory on the way from
           `owned_from` (the workdir) is a symlink or another user's (base.make_dirs).
        2. flock(LOCK_EX) on `<root>/<digest>.lock` (O_NOFOLLOW, 0600), waiting at most `timeout`: two deployments
           building the same environment build it once; the kernel drops the lock when its holder dies.
        3. `<root>/<digest>` a link to a complete build (its record names `digest`): reused, nothing built.
        4. builds of this digest no link points to (dead ones) and leftover link temps removed, never followed.
        5. each step's argv run in order (its own session, killed with its group past the deadline), stdout and
           stderr kept; the first that fails ends the build, its build dir removed.
        6. the record (`record` + `built_at` + `resolved` from the last step's `pip list --format json`) written
           into the build dir (0600 temp, fsync, rename), then `<digest>.link-<id>` -> `<digest>.build-<id>` renamed
           over `<digest>` (rename(2) is atomic; a venv cannot be moved, so the link publishes it).
    -> {reused: bool, record: text | null, failed: step name | null, exit_code, timed_out, output (the failed
        step's stdout + stderr tail), steps: [{name, seconds}]}
    With `reuse_only`, steps 3 only (nothing created): {reused: true, record} or {reused: false, record: null}.
    A reuse touches the published link (its mtime, not the build's): retention spares an environment used lately.

    env_prune {root, owned_from, keep: [digests], min_age_s}
        environments no kept run uses (`keep`) and not used for `min_age_s` (the link's mtime), with their builds;
        dead builds and link temps; each digest only while its lock is free (taken non-blocking, held while its
        entries go), never through a symlink. Lock files and names deployer did not make are left.
    -> {removed: [names]}
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import stat
import subprocess
import time
from typing import Any, Dict, List, Optional

from .base import communicate_bounded, make_dirs, remove_entry, try_lock

RECORD_NAME = "deployer-env.json"
BUILD_MARK = ".build-"
LINK_MARK = ".link-"
OUTPUT_TAIL = 64 * 1024
LOCK_POLL_S = 0.2
_DIGEST = re.compile(r"^[0-9a-f]{16}$")
_BUILD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NAME_RUN = re.compile(r"[-_.]+")


# Process groups of the build steps running now: the helper ends them when its conversation ends (the deploy was
# interrupted or its connection dropped), so no pip keeps writing into a build whose lock is gone.
RUNNING: "set[int]" = set()


def stop_running() -> None:
    for pgid in list(RUNNING):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


class BuildRefused(Exception):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def env_build(req: Dict[str, Any], base_env: Dict[str, str]) -> Dict[str, Any]:
    root, digest, build_id = os.path.normpath(str(req["root"])), str(req["digest"]), str(req["build_id"])
    if not _DIGEST.match(digest) or not _BUILD_ID.match(build_id) or not os.path.isabs(root):
        raise BuildRefused("env_build: a digest of 16 hex digits, a build id and an absolute root are needed",
                           "bad-request")
    deadline = time.monotonic() + float(req.get("timeout") or 1800.0)
    if req.get("reuse_only") and not os.path.isdir(root):
        return _reply()
    _no_link_below(root, str(req["owned_from"]))
    make_dirs(root, str(req["owned_from"]))
    _no_link_below(root, str(req["owned_from"]))
    fd = _lock(os.path.join(root, digest + ".lock"), deadline)
    try:
        record = published_record(root, digest)
        if record is not None:
            os.utime(os.path.join(root, digest), follow_symlinks=False)
            return _reply(reused=True, record=record)
        if req.get("reuse_only"):
            return _reply()
        _clear_dead(root, digest)
        build = os.path.join(root, digest + BUILD_MARK + build_id)
        timings: List[Dict[str, Any]] = []
        last = ""
        for step in req["steps"]:
            name = str(step["name"])
            started = time.monotonic()
            code, out, timed_out = _run([str(a) for a in step["argv"]], dict(base_env, **(step.get("env") or {})),
                                        deadline)
            timings.append({"name": name, "seconds": round(time.monotonic() - started, 3)})
            if code != 0:
                remove_entry(build)
                return _reply(failed=name, exit_code=code, timed_out=timed_out, output=out[-OUTPUT_TAIL:],
                              steps=timings)
            last = out
        text = _record_text(dict(req["record"]), last)
        _write_record(build, text)
        _publish(root, digest, build_id)
        return _reply(record=text, steps=timings)
    finally:
        os.close(fd)


def env_prune(req: Dict[str, Any]) -> Dict[str, Any]:
    root, owned_from = os.path.normpath(str(req["root"])), str(req["owned_from"])
    keep = set(str(d) for d in req.get("keep") or ())
    min_age = float(req.get("min_age_s") or 0.0)
    if not os.path.isdir(root):
        return {"removed": []}
    _no_link_below(root, owned_from)
    make_dirs(root, owned_from)   # checks the chain (nothing is created: it exists)
    digests = sorted({n.split(".", 1)[0] for n in os.listdir(root) if _DIGEST.match(n.split(".", 1)[0])})
    removed: List[str] = []
    for digest in digests:
        if digest in keep:
            continue
        fd = try_lock(os.path.join(root, digest + ".lock"))
        if fd is None:
            continue  # a build or a reuse of it is in progress
        try:
            removed += _prune_digest(root, digest, min_age)
        finally:
            os.close(fd)
    return {"removed": removed}


def _prune_digest(root: str, digest: str, min_age: float) -> List[str]:
    link = os.path.join(root, digest)
    linked = None
    try:
        st = os.lstat(link)
        if stat.S_ISLNK(st.st_mode):
            linked = os.readlink(link)
            if time.time() - st.st_mtime < min_age:
                return []  # used lately: a deployment may be about to launch from it
    except FileNotFoundError:
        pass
    gone = []
    for name in sorted(os.listdir(root)):
        if name == digest or name.startswith(digest + BUILD_MARK) or name.startswith(digest + LINK_MARK):
            if name != digest and name == linked:
                continue  # removed after its link, below
            remove_entry(os.path.join(root, name))
            gone.append(name)
    if linked is not None and "/" not in linked and linked.startswith(digest + BUILD_MARK):
        remove_entry(os.path.join(root, linked))
        gone.append(linked)
    return gone


def _no_link_below(root: str, owned_from: str) -> None:
    """No symlink between the workdir (which may itself be one, to a disk of ours) and the envs dir: deployer
    never builds through one."""
    top = os.path.normpath(owned_from)
    if not root.startswith(top.rstrip("/") + "/"):
        raise BuildRefused("%s is not inside the workdir %s: refused" % (root, owned_from), "unsafe")
    step = top
    for part in [p for p in root[len(top):].split("/") if p]:
        step = os.path.join(step, part)
        try:
            if stat.S_ISLNK(os.lstat(step).st_mode):
                raise BuildRefused("%s is a symbolic link: refused (deployer never builds through one)" % step,
                                   "unsafe")
        except FileNotFoundError:
            return


def _reply(**fields: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"reused": False, "record": None, "failed": None, "exit_code": 0, "timed_out": False,
                           "output": "", "steps": []}
    out.update(fields)
    return out


def _lock(path: str, deadline: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
            raise BuildRefused("%s is not a file of ours: refused" % path, "unsafe")
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() >= deadline:
                raise BuildRefused("another deployment has been building this environment (%s) for longer than "
                                   "the build timeout" % path, "busy")
            time.sleep(LOCK_POLL_S)
    except BaseException:
        os.close(fd)
        raise


def published_record(root: str, digest: str) -> Optional[str]:
    """The record of the complete build `<root>/<digest>` links to, else None (missing, not ours, not intact)."""
    link = os.path.join(root, digest)
    try:
        if not stat.S_ISLNK(os.lstat(link).st_mode):
            return None
        target = os.readlink(link)
    except OSError:
        return None
    if "/" in target or not target.startswith(digest + BUILD_MARK):
        return None
    path = os.path.join(root, target, RECORD_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_uid != os.getuid():
            return None
        text = f.read(4 << 20).decode("utf-8", "replace")
    try:
        if json.loads(text).get("digest") != digest:
            return None
    except (ValueError, AttributeError):
        return None
    return text


def _clear_dead(root: str, digest: str) -> None:
    """Builds and link temps of `digest` left by a build that died (we hold its lock: nobody builds it now)."""
    for name in os.listdir(root):
        if name.startswith(digest + BUILD_MARK) or name.startswith(digest + LINK_MARK):
            remove_entry(os.path.join(root, name))
    try:
        if not stat.S_ISLNK(os.lstat(os.path.join(root, digest)).st_mode):
            remove_entry(os.path.join(root, digest))  # not ours to reuse (a dir someone made by hand)
    except FileNotFoundError:
        pass


def _run(argv: List[str], env: Dict[str, str], deadline: float) -> "tuple[int, str, bool]":
    left = deadline - time.monotonic()
    if left <= 0:
        return -1, "the build timed out before %s" % argv[0], True
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    except OSError as e:
        return 127, "%s: %s" % (argv[0], e.strerror or e), False
    RUNNING.add(proc.pid)
    try:
        out, _, timed_out = communicate_bounded(proc, None, left)
        if timed_out:
            return -1, out.decode("utf-8", "replace") + "\n(the build timed out)", True
        return proc.returncode, out.decode("utf-8", "replace"), False
    finally:
        RUNNING.discard(proc.pid)


def _canonical(name: str) -> str:
    return _NAME_RUN.sub("-", name).lower()


def _record_text(record: Dict[str, Any], freeze: str) -> str:
    """The record: what the client sent, when it was built, and what is installed (the last step's JSON package
    list; a URL and size where the client's resolution had that very version)."""
    hints = {(_canonical(str(d["name"])), str(d["version"])): d for d in record.pop("resolved_hint", None) or []}
    try:
        listed = json.loads(freeze[freeze.find("["):]) if "[" in freeze else []
    except ValueError:
        listed = []
    resolved = []
    for item in sorted(listed, key=lambda d: _canonical(str(d.get("name")))):
        name, version = str(item.get("name")), str(item.get("version"))
        hint = hints.get((_canonical(name), version)) or {}
        resolved.append({"name": name, "version": version, "url": hint.get("url"), "size": hint.get("size")})
    record["resolved"] = resolved
    record["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps(record, indent=1, sort_keys=True)


def _write_record(build: str, text: str) -> None:
    st = os.lstat(build)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise BuildRefused("%s is not a directory of ours after the build: refused" % build, "unsafe")
    tmp = os.path.join(build, "." + RECORD_NAME + ".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(build, RECORD_NAME))
    _fsync_dir(build)


def _publish(root: str, digest: str, build_id: str) -> None:
    temp = os.path.join(root, digest + LINK_MARK + build_id)
    remove_entry(temp)
    os.symlink(digest + BUILD_MARK + build_id, temp)
    os.replace(temp, os.path.join(root, digest))
    _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
