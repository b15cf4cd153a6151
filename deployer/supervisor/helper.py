#!/usr/bin/env python3
"""The target-side helper: one process per deployer command, answering line-delimited JSON on stdin/stdout.

Stdlib only, Python >= 3.8. The deployer starts it once over a single exec channel (deployer/remote/conversation.py;
`serve HASH`) and sends everything it needs done on the target as requests on that channel, so a command pays the
target's login shell (its rc file: conda/pyenv init, ~150 ms) once instead of once per step. The helper announces
itself with one line `{"hello": {...}}`, then reads requests

    {"id": N, "op": OP, ...}        (OP: a name of protocol.OPS, the one table of operations)

and answers each with one line `{"id": N, "ok": true, ...}` or `{"id": N, "ok": false, "error": "...", "kind": K}`.
Every request gets its answer, whatever it holds: nesting deeper than MAX_DEPTH, a number that is not finite or
beyond MAX_NUMBER (`NaN`, `Infinity`, `1e400`, `1e30`), and anything an op did not foresee are refused with an error
reply (kind `bad-request`, or `internal`), never met with silence.
Requests run concurrently (one thread each), so a heartbeat is never queued behind a long command; replies may
come out of order and carry the request's id.

- `run {cmd, stdin_b64?, timeout}`: `bash -c cmd` in its own session (the environment the login shell set up is
  inherited), killed with its whole process group after `timeout`; `{exit_code, stdout, stderr, timed_out}`.
- `supervise {argv}`: a read-only supervisor command (`status`, `ports`, `listener`) answered in this process,
  with the exit code and output `supervise.py ARGV` would give (no python start-up per call).
- `snapshot {argv}`: the read-only snapshot of a deployment dir (snapshot.py's `snapshot ARGV`), as
  `{data}`: what status, logs and history read, answered in this process.
- `install {files: [{path, mode, sha256, data_b64}]}`: write each file to a 0600 temp name beside it, fsync, check
  its sha256 as read back, then chmod and rename each into place (none placed if any cannot be written);
  `{digests}`. A run dir's files travel in this one request instead of ~5 SFTP round trips each.
- `mkdirs {path, owned_from}`: create the missing directories of `path` (0700), refused (kind `unsafe`, one line)
  when another user owns or can write one at or below `owned_from`, or one above it without the sticky bit.
- `read {path, offset, limit}`: at most `limit` bytes from `offset`, as `{data_b64}`; `size {path}`: `{size}`
  (null for no such file). Both reach the file a component at a time, never through a link another user owns, the
  last component never a link (files.open_to_read; kind `unsafe`, one line naming it and its owner). A missing file is an error of kind `notfound`. One round trip each, where SFTP needs
  a session (its own login shell) and an open/stat/read/close per read.
- `http {method, address, port, path, headers, body_b64?, timeout}`: one HTTP/1.1 request from the target (a
  health check, the router's API): `{status, headers, body_b64}`; nothing answering is an error of kind
  `unreachable`. One round trip, where a direct-tcpip channel costs two (open, then the request).
- `verify {paths}`: fsync and sha256 each uploaded file; `{digests}` (null for a file that cannot be read).
- `lease_take {path, holder, token, lease_s, mode, from?}`: the deployment lock's lease (supervise_lease.py's
  rules, events and file format); `{word: LOCKED|BUSY|LOST|UNSAFE, data}`. The helper keeps the lease file open.
- `lease_beat {token, release}`: renew (or release) it; `{word: OK|LOST|RELEASED, data}`.
- `env_build {root, owned_from, digest, build_id, steps, record, timeout}`: build a managed engine environment
  once per host under its lock and publish it atomically (install.py); `env_prune {root, owned_from,
  keep, min_age_s}`: retention of the ones no kept run uses. Both fenced.
- `link`, `readlink`, `remove`, `disk`, `mkdir`, `listdir`, `find_bytes`, `kernel_log`, `lease_show`, `runs`: the
  file ops of a deployment dir (files.py): inside the deployment dir only, never through a symlink.
- `fetch`, `push`: programs of their own (fetch.py, push.py), minutes long: this payload run
  again as a child (`python3 -B /dev/fd/N OP`, its text in a pipe), `{pid}` at once, then its stdout+stderr lines as
  `{"stream": N, "line": TEXT}` and `{"stream": N, "end": CODE}`; `feed {stream, data_b64?, eof?}` writes its stdin
  or closes it (it ends as it did when its exec channel closed). The helper's own end closes their stdin too.

Dispatch: each op of the table is answered by this helper's method of its name or by its module's function of that
name (protocol.Op); the ops the table marks `changes` are fenced first (below). An op's refusal that
carries a `kind` (UnsafePath: `unsafe`, OpRefused, BuildRefused, FetchError) is the error reply of that kind.

Fencing: while the helper holds a lease, the ops the table marks `changes` (a start, a stop, a write: `run`,
`install`, `mkdirs`, the file ops that change files, the environments' build and retention) first check that every
lease it holds is still current and unexpired; once one is not (someone broke the lock or took it over), they are
refused for the rest of the conversation (kind `fenced`): the operation that lost its lock cannot start, stop or
bring back anything. Commands run under a lease get its token in env DEPLOYER_LEASE_TOKENS (a supervisor
started then checks it before each restart: lease.restart_refusal).

EOF on stdin ends the conversation: the helper exits at once without releasing a lease it holds (as the lease
program does: a client whose connection dropped re-takes it with its token, anyone else after it expires).
Commands still running keep running (a `stop` in progress is not cut short); their replies go nowhere. An
environment build's steps are the exception: they are killed (their build lock is this process's). A program op's
child (fetch, push) sees its stdin end with this process and ends, as it did when its exec channel closed.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib
import io
import json
import math
import os
import re
import subprocess
import sys
import threading
from typing import Any, BinaryIO, Callable

from .supervise import dispatch, main as supervise_main, status_of
from .base import PYTHON_FLAGS, SuperviseError, UnsafePath, communicate_bounded, make_dirs
from .lease import FENCE_ENV, LeaseError, Refused, acquire, still_ours, update
from .snapshot import snapshot as take_snapshot
from .protocol import IN_HELPER, OPS
from .files import read_bytes, size_of
from .install import env_build, stop_running

PROTOCOL = 1
READ_MAX = 64 << 20
MAX_LEASE_S = 7 * 86400.0
KILL_WAIT_S = 2.0
MAX_TIMEOUT_S = 3600.0
# Supervisor commands answered inside the helper (quick, read-only); start and stop stay processes of their own.
IN_PROCESS = IN_HELPER


MAX_DEPTH = 64              # nesting of a request's JSON (deployer's own go 4 deep)
MAX_NUMBER = (1 << 63) - 1  # the largest number a request may carry (what a C int64 holds: bytes, offsets)
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(-?\d{1,15})\s*[,}]')


class RequestError(Exception):
    def __init__(self, message: str, kind: str = "bad-request") -> None:
        super().__init__(message)
        self.kind = kind



class Helper:
    """The request dispatcher; `out` is where reply lines go (one write per line, under a lock)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._write = threading.Lock()
        self._leases: dict[str, tuple[int, float]] = {}  # token -> (open lease fd, lease seconds)
        self._lease_lock = threading.Lock()
        self._fenced: str | None = None  # why changes are refused: a lease this helper held is no longer ours
        self._supervise_lock = threading.Lock()  # their output is captured from sys.stdout: one at a time
        # the protocol's table of operations (protocol.OPS): each answered by this helper's method of its
        # name, or by its supervisor module's function of that name (that module imported when first asked)
        self.ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            name: functools.partial(self.start_program, name) if op.program else getattr(self, name)
            if op.module is None else functools.partial(_module_op, op.module, name)
            for name, op in OPS.items()}
        self._programs: dict[int, subprocess.Popen[bytes]] = {}  # a program op's request id -> its running child
        self._programs_lock = threading.Lock()

    def say(self, data: dict[str, Any]) -> None:
        line = json.dumps(data, sort_keys=True).encode() + b"\n"
        with self._write:
            try:
                self._out.write(line)
                self._out.flush()
            except (OSError, ValueError):
                pass  # the client is gone; EOF on stdin ends the conversation

    def finish(self) -> None:
        """Leave now, without the interpreter's shutdown: it would flush stdout while a request's thread may hold
        its lock (a reply just written), and wait a second for it per stream. Requests still running are left,
        except an environment build's steps (stopped: their build lock goes with this process)."""
        stop_running()
        if self._write.acquire(timeout=KILL_WAIT_S):  # no reply half-written
            try:
                self._out.flush()
            except (OSError, ValueError):
                pass
        os._exit(0)

    def handle(self, raw: bytes) -> None:
        found = _ID.match(raw)
        rid: Any = int(found.group(1)) if found else None  # the id, even of a request that cannot be parsed
        try:
            req = parse_request(raw)
            if not isinstance(req, dict):
                raise RequestError("a request is a JSON object")
            rid = req.get("id")
            name = str(req.get("op"))
            op = self.ops.get(name)
            if op is None:
                raise RequestError(f"unknown op {req.get('op')!r}")
            if OPS[name].changes:
                self.fence()
            self.say({"id": rid, "ok": True, **op(req)})
        except RequestError as e:
            self.say({"id": rid, "ok": False, "error": str(e), "kind": e.kind})
        except UnsafePath as e:   # a path another user controls, one line naming it (base)
            self.say({"id": rid, "ok": False, "error": str(e), "kind": "unsafe"})
        except LeaseError as e:
            self.say({"id": rid, "ok": False, "error": str(e), "kind": "lease"})
        except (ValueError, KeyError, TypeError) as e:
            self.say({"id": rid, "ok": False, "error": f"bad request: {type(e).__name__}: {e}", "kind": "bad-request"})
        except OSError as e:
            self.say({"id": rid, "ok": False, "error": f"{e.strerror or e}", "kind": "os"})
        except Exception as e:  # noqa: BLE001 - whatever went wrong, the client gets its answer, not silence
            kind = getattr(e, "kind", None)   # an op's own refusal (OpRefused, BuildRefused, FetchError): its kind
            if isinstance(kind, str):
                self.say({"id": rid, "ok": False, "error": str(e), "kind": kind})
                return
            why = f"{type(e).__name__}: {e}"[:300]
            self.say({"id": rid, "ok": False, "error": f"the request could not be answered: {why}",
                      "kind": "internal"})

    # -- ops ----------------------------------------------------------------------------------------------

    def fence(self) -> list[str]:
        """Refuse a change (kind `fenced`) once a lease this helper holds is no longer ours; the held tokens."""
        with self._lease_lock:
            held = list(self._leases.items())
        for token, (fd, _) in held:
            if self._fenced is None:
                ours, lease = still_ours(fd, token)
                if not ours:
                    who = "%s pid %s (%s)" % (lease.get("owner"), lease.get("pid"), lease.get("command")) \
                        if lease.get("held") else ""
                    self._fenced = "the deployment lock is no longer ours (%s)" % (
                        "now held by " + who if who else "another took it and has released it since")
        if self._fenced is not None:
            raise RequestError("refused: %s; nothing was changed" % self._fenced, "fenced")
        return [token for token, _ in held]

    def _fenced_env(self) -> dict[str, str]:
        """The environment of a command an op starts: the login shell's, with the lease tokens this helper holds
        (checked by `fence` before the op ran), so that a supervisor it starts can check them in turn."""
        env = _child_env()
        with self._lease_lock:
            tokens = list(self._leases)
        if tokens:
            env[FENCE_ENV] = ",".join(tokens)
        return env

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd, timeout = str(req["cmd"]), min(float(req.get("timeout") or 60.0), MAX_TIMEOUT_S)
        stdin = base64.b64decode(req["stdin_b64"]) if req.get("stdin_b64") is not None else None
        proc = subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                env=self._fenced_env())
        out, err, timed_out = communicate_bounded(proc, stdin, timeout)
        return {"exit_code": -1 if timed_out else proc.returncode, "timed_out": timed_out,
                "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")}

    def supervise(self, req: dict[str, Any]) -> dict[str, Any]:
        """A read-only supervisor command run in this process: the output `supervise.py ARGV` would print."""
        argv = [str(a) for a in req["argv"]]
        if not argv or argv[0] not in IN_PROCESS:
            raise RequestError(f"supervise: only {', '.join(IN_PROCESS)} run inside the helper")
        out, err = io.StringIO(), io.StringIO()
        with self._supervise_lock, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = dispatch(argv)
            except SuperviseError as e:
                print(f"supervise: {e}", file=sys.stderr)
                code = e.code
        return {"exit_code": code, "timed_out": False, "stdout": out.getvalue(), "stderr": err.getvalue()}

    def snapshot(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"data": take_snapshot([str(a) for a in req["argv"]], self.live_status)}
        except SuperviseError as e:
            raise RequestError(str(e), "snapshot") from None

    def live_status(self, run_dir: str) -> dict[str, Any]:
        """A run's live status, as `supervise.py status` says it (its state, its processes alive or not)."""
        return status_of(run_dir)

    def install(self, req: dict[str, Any]) -> dict[str, Any]:
        files = [(str(f["path"]), int(f["mode"]), str(f["sha256"]), base64.b64decode(f["data_b64"]))
                 for f in req["files"]]
        temps: list[str] = []
        where = files[0][0] if files else ""
        try:
            for where, _, digest, data in files:
                temps.append(_write_temp(where, data))
                got = _fsync_sha256(temps[-1])
                if got != digest:
                    raise RequestError(f"sha256 mismatch after writing {where}: got {got}", "mismatch")
            for (where, mode, _, _), tmp in zip(files, list(temps)):
                os.chmod(tmp, mode)
                os.replace(tmp, where)
                temps.remove(tmp)
        except OSError as e:
            raise RequestError(f"cannot write {where}: {e.strerror or e}", "os") from None
        finally:
            for tmp in temps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return {"digests": [digest for _, _, digest, _ in files]}

    def mkdirs(self, req: dict[str, Any]) -> dict[str, Any]:
        """`mkdir -p` of a deployment's directories that refuses a chain another user controls (kind `unsafe`)."""
        try:
            make_dirs(str(req["path"]), str(req["owned_from"]))
        except OSError as e:
            raise RequestError(f"cannot create {e.filename or req['path']}: {e.strerror or e}", "os") from None
        return {}

    def env_build(self, req: dict[str, Any]) -> dict[str, Any]:
        """install.py's build of a managed environment: its steps run with the lease tokens in their
        environment as `run`'s commands do."""
        return env_build(req, self._fenced_env())

    def start_program(self, name: str, req: dict[str, Any]) -> dict[str, Any]:
        """A program op (protocol.Op.program): this payload run again as a child, `name` its argument, its
        stdin the `feed` op's, its stdout+stderr lines relayed as stream lines of this request's id."""
        rid = req["id"]
        if not isinstance(rid, int):
            raise RequestError(f"{name}: a program's request needs an integer id")
        source = own_program()
        r, w = os.pipe()
        try:
            proc = subprocess.Popen([sys.executable or "python3", *PYTHON_FLAGS, "/dev/fd/%d" % r, name], pass_fds=(r,),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=_child_env())
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        threading.Thread(target=_write_and_close, args=(w, source), daemon=True).start()
        with self._programs_lock:
            self._programs[rid] = proc
        threading.Thread(target=self._relay, args=(rid, proc), daemon=True).start()
        return {"pid": proc.pid}

    def _relay(self, rid: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            self.say({"stream": rid, "line": line.decode("utf-8", "replace").rstrip("\n")})
        code = proc.wait()
        with self._programs_lock:
            self._programs.pop(rid, None)
        self.say({"stream": rid, "end": code})

    def feed(self, req: dict[str, Any]) -> dict[str, Any]:
        """Bytes to a running program's stdin, or its stdin closed (`eof`): the program then ends as it does when its
        caller goes."""
        with self._programs_lock:
            proc = self._programs.get(int(req["stream"]))
        if proc is None or proc.stdin is None:
            raise RequestError("no program of this stream runs (it ended)", "ended")
        if req.get("data_b64") is not None:
            proc.stdin.write(base64.b64decode(req["data_b64"]))
            proc.stdin.flush()
        if req.get("eof"):
            proc.stdin.close()
        return {}

    def read(self, req: dict[str, Any]) -> dict[str, Any]:
        path, offset = str(req["path"]), int(req.get("offset") or 0)
        limit = min(int(req["limit"]), READ_MAX)   # a reply holds at most READ_MAX bytes (the client reads on)
        try:
            data = read_bytes(path, offset, limit)   # a component at a time, no link followed (files)
        except FileNotFoundError:
            raise RequestError(f"{path}: no such file", "notfound") from None
        return {"data_b64": base64.b64encode(data).decode("ascii")}

    def size(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"size": size_of(str(req["path"]))}

    def http(self, req: dict[str, Any]) -> dict[str, Any]:
        import http.client  # only for commands that ask (its import is most of a helper start's imports)
        import socket

        method, address, port, path = str(req["method"]), str(req["address"]), int(req["port"]), str(req["path"])
        body = base64.b64decode(req["body_b64"]) if req.get("body_b64") is not None else None
        where = "%s:%d" % (address, port)
        conn = http.client.HTTPConnection(address, port, timeout=min(float(req.get("timeout") or 5.0), MAX_TIMEOUT_S))
        try:
            conn.request(method, path, body=body, headers=dict(req.get("headers") or {}))
            resp = conn.getresponse()
            data = resp.read()
        except ConnectionRefusedError:
            raise RequestError(where + ": nothing listening", "unreachable") from None
        except (OSError, http.client.HTTPException) as e:
            why = "timed out" if isinstance(e, socket.timeout) else "failed: %s: %s" % (type(e).__name__, e)
            raise RequestError("HTTP %s %s%s %s" % (method, where, path, why), "unreachable") from None
        finally:
            conn.close()
        return {"status": resp.status, "headers": [[k.lower(), v] for k, v in resp.getheaders()],
                "body_b64": base64.b64encode(data).decode("ascii")}

    def verify(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"digests": [_fsync_sha256(str(p)) for p in req["paths"]]}

    def lease_take(self, req: dict[str, Any]) -> dict[str, Any]:
        holder, token, lease_s = req["holder"], str(req["token"]), float(req["lease_s"])
        if not isinstance(holder, dict) or not token or not 0 < lease_s <= MAX_LEASE_S:
            raise RequestError("lease_take needs a holder object, a token and a lease_s above 0 and at most "
                               "%g seconds" % MAX_LEASE_S)
        try:
            fd, info = acquire(str(req["path"]), holder, token, lease_s, str(req.get("mode") or "take"),
                               str(req.get("from") or ""))
        except Refused as r:
            return {"word": r.verdict.upper(), "data": r.lease}
        with self._lease_lock:
            old = self._leases.pop(token, None)
            self._leases[token] = (fd, lease_s)
        if old is not None:
            _close(old[0])
        return {"word": "LOCKED", "data": info}

    def lease_beat(self, req: dict[str, Any]) -> dict[str, Any]:
        token, release = str(req["token"]), bool(req.get("release"))
        with self._lease_lock:
            held = self._leases.get(token)
        if held is None:
            raise RequestError("no lease with this token is held by this helper", "lease")
        fd, lease_s = held
        ok, lease = update(fd, token, lease_s, release=release)
        if not ok or release:
            with self._lease_lock:
                self._leases.pop(token, None)
            _close(fd)
        if not ok:
            self._fenced = self._fenced or "the deployment lock is no longer ours (now held by %s pid %s (%s))" % (
                lease.get("owner"), lease.get("pid"), lease.get("command"))
            return {"word": "LOST", "data": lease}
        return {"word": "RELEASED" if release else "OK", "data": {"lease_s": lease_s}}


def _child_env() -> dict[str, str]:
    """The login shell's environment, one shell level down, as a command it ran itself would see it.

    The login shell exec'ed this helper, which lowers SHLVL to 0; bash under sshd reads ~/.bashrc at a level
    below 2, so each command would run the rc file (conda init, ~150 ms) again. Its effects are inherited already.
    """
    env = dict(os.environ)
    try:
        level = int(env.get("SHLVL") or 0)
    except ValueError:
        level = 0
    env["SHLVL"] = str(max(1, level))
    return env


def _module_op(module: str, name: str, req: dict[str, Any]) -> dict[str, Any]:
    """An op answered by a supervisor module's function, its module imported on first use (a helper start imports
    only what it runs: the weights' fetch alone pulls in urllib and http.client)."""
    answer: dict[str, Any] = getattr(importlib.import_module("." + module, __package__), name)(req)
    return answer


def own_program() -> bytes:
    """This helper's program text: what its loader checked and ran (remote/conversation.py's _LOADER, run as
    `python3 -c`, so `__main__`, keeps it in its global `src`), else the file it runs from."""
    text = getattr(sys.modules.get("__main__"), "src", None)
    if isinstance(text, bytes):
        return text
    with open(sys.argv[0], "rb") as f:
        return f.read()


def _write_and_close(fd: int, data: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError:
        pass  # the child is gone already: its end says so


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _write_temp(path: str, data: bytes) -> str:
    """`data` in a new 0600 file beside `path` (secrets are never readable by others, not even for a moment)."""
    folder, base = os.path.split(path)
    tmp = os.path.join(folder or ".", ".%s.%s.part" % (base, os.urandom(6).hex()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _fsync_sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _nesting(raw: bytes) -> int:
    """How deep the JSON text `raw` nests (strings skipped), counted without parsing it."""
    depth = deepest = 0
    for c in _STRINGS.sub(b'""', raw):
        if c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
    return deepest


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise RequestError(f"bad request: the number {text[:40]} is out of range (at most {MAX_NUMBER})")
    return value


def _integer(text: str) -> int:
    if len(text) > 20 or abs(int(text)) > MAX_NUMBER:
        raise RequestError(f"bad request: the number {text[:40]} is out of range (at most {MAX_NUMBER})")
    return int(text)


def _constant(text: str) -> Any:
    raise RequestError(f"bad request: {text} is not a number a request may carry")


def parse_request(raw: bytes) -> Any:
    """A request line as JSON, bounded: nesting at most MAX_DEPTH, every number finite and at most MAX_NUMBER
    (NaN and Infinity refused); RequestError otherwise."""
    if _nesting(raw) > MAX_DEPTH:
        raise RequestError(f"bad request: JSON nested deeper than {MAX_DEPTH}")
    return json.loads(raw.decode("utf-8"), parse_float=_number, parse_int=_integer, parse_constant=_constant)


def serve(version: str, stdin: BinaryIO, stdout: BinaryIO) -> int:
    helper = Helper(stdout)
    helper.say({"hello": {"protocol": PROTOCOL, "version": version, "pid": os.getpid(),
                          "home": os.environ.get("HOME", ""), "python": sys.executable}})
    while True:
        line = stdin.readline()
        if not line:
            helper.finish()
            return 0
        if line.strip():
            threading.Thread(target=helper.handle, args=(line,), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in OPS and OPS[args[0]].program:   # a program op's child: that module's main
        module = importlib.import_module("." + str(OPS[args[0]].module), __package__)
        return int(module.main(args[1:]))
    if args[:1] == ["supervise"]:   # a supervisor command on a bare connection (remote/oneshot.py)
        return supervise_main(args[1:])
    if args[:1] == ["request"] and len(args) == 2:   # one request, its reply line on stdout (remote/oneshot.py)
        out = io.BytesIO()
        Helper(out).handle(args[1].encode())
        sys.stdout.write(out.getvalue().decode())
        return 0
    if not args or args[0] != "serve":
        print("usage: helper.py serve [VERSION] | supervise ARGV | request JSON | "
              + " | ".join(n for n, op in OPS.items() if op.program), file=sys.stderr)
        return 2
    try:
        return serve(args[1] if len(args) > 1 else "", sys.stdin.buffer, sys.stdout.buffer)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
