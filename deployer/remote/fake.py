"""`FakeRemote`: a scripted target for unit tests, as httpx's MockTransport is for httpx.

It is a transport like SSHRemote and LocalRemote: the helper conversation (remote/conversation.py) spawns its
helper on it and speaks the real line-delimited JSON protocol, so everything above the seam runs unchanged. What
answers is scripted in memory: files (`files`, `links`, `dirs`), a fake supervisor that "starts" an engine whose
log and fate the test gives (`EngineScript`, chosen per start by `FakeRemote.engine`), the engine's /health on its
port, the deployment lock's lease, the helper's file ops and snapshots (from the same memory). Shell text that
reaches `run` is answered by `FakeShell`'s table of patterns (the few commands the pipeline still sends as shell); a command nobody scripted fails with exit 127 and is
kept in `unknown`, so a test sees a step that started sending something new.

Nothing here touches the network, a process or the disk: a whole `up` runs in milliseconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
import re
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import NotFound, RemoteError
from deployer.remote.base import Hasher, HttpReply, NoLine, Result, Transport
from deployer.remote.program import SUPERVISOR_PYTHON, payload_bundle
from deployer.supervisor.files import named_payload
from deployer.supervisor.protocol import ENGINE_LOG, OUTCOME_JSON, PROFILE_JSON, STATE_JSON, State

FAKE = "fake"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
SUPERVISOR_PID = 4000


@dataclass(frozen=True)
class EngineScript:
    """What one started engine does: prints `log`, then serves (`ready`) or dies with `exit_code`."""

    log: str
    ready: bool = True
    exit_code: int = 1
    generates: bool = True      # its /v1/completions answers a token (False: /health 200, completions 503)

    @classmethod
    def serving(cls, ready_line: str = "The server is fired up and ready to roll!") -> EngineScript:
        return cls(f"loading the model\n{ready_line}\n")

    @classmethod
    def crashing(cls, log: str, exit_code: int = 1) -> EngineScript:
        return cls(log, ready=False, exit_code=exit_code)


@dataclass
class Started:
    """One engine the fake supervisor started: its run dir, its profile.json and what it was scripted to do."""

    run_dir: str
    record: dict[str, Any]
    script: EngineScript
    port: int | None


@dataclass
class FakeShell:
    """Shell command lines the target is asked to run, answered by pattern (the first `re.search` that matches)."""

    handlers: list[tuple[re.Pattern[str], Callable[[str, bytes], Result]]] = field(default_factory=list)

    def on(self, pattern: str, answer: Callable[[str, bytes], Result]) -> None:
        """Answer command lines matching `pattern` (tried before the ones already there)."""
        self.handlers.insert(0, (re.compile(pattern), answer))

    def answer(self, cmd: str, stdin: bytes) -> Result | None:
        for pattern, handler in self.handlers:
            if pattern.search(cmd):
                return handler(cmd, stdin)
        return None


def ok(cmd: str, stdout: str = "") -> Result:
    return Result(cmd, 0, stdout, "")


class FakeRemote:
    """The scripted target (see the module's docstring). `engine(started_count, record) -> EngineScript`."""

    label = FAKE    # a transport: its helper requests are the Conversation's opened on it

    def __init__(self, engine: Callable[[int, dict[str, Any]], EngineScript] | None = None,
                 home: str = "/home/fake") -> None:
        self.engine = engine or (lambda _n, _record: EngineScript.serving())
        self.home = home
        self.files: dict[str, bytes] = {}
        self.links: dict[str, str] = {}
        self.dirs: set[str] = {"/", home}
        self.started: list[Started] = []
        self.states: dict[str, State] = {}        # run dir -> the engine's state (also written to state.json)
        self.listening: dict[int, str] = {}       # port -> the run dir whose engine serves it
        self.requests: list[dict[str, Any]] = []  # every helper request, in order (for assertions)
        self.unknown: list[str] = []              # command lines no pattern answered
        self.peers: dict[str, FakeRemote] = {}    # address -> the fake host that answers HTTP sent there
        self.addresses: set[str] = set(LOOPBACK)  # where HTTP reaches this host itself (add its own names)
        self.shell = FakeShell()
        self.spawned = 0
        self._lock = threading.RLock()
        self._default_shell()

    # -- the transport ----------------------------------------------------------------------------------

    def spawn(self, cmd: str) -> FakeSession:
        if "helper-" not in cmd:
            raise RemoteError(f"the fake runs only the deployer helper, not {cmd[:80]!r}", host=FAKE)
        self.spawned += 1
        return FakeSession(self)

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        with self._lock:
            for data, path, _mode in files:
                self._write(path, data)
        return [hashlib.sha256(data).hexdigest() for data, _, _ in files]

    def put(self, data: bytes, path: str, mode: int = 0o644) -> str:
        return self.put_all([(data, path, mode)])[0]

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        with self._lock:
            if path not in self.files:
                raise NotFound(f"{FAKE}: {path}: no such file")
            return self.files[path][offset:offset + limit]

    def size(self, path: str) -> int | None:
        with self._lock:
            data = self.files.get(path)
            return None if data is None else len(data)

    def run(self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None) -> Result:
        raise RemoteError("the fake answers commands through its helper only (open a Conversation on it)", host=FAKE)

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> HttpReply:
        raise RemoteError("the fake answers HTTP through its helper only (open a Conversation on it)", host=FAKE)

    def close(self) -> None:
        pass

    # -- the target's state -----------------------------------------------------------------------------

    def _write(self, path: str, data: bytes) -> None:
        self.files[path] = data
        self.dirs.add(posixpath.dirname(path))

    def json_file(self, path: str) -> dict[str, Any] | None:
        data = self.files.get(path)
        return None if data is None else dict(json.loads(data))

    def current(self, root: str) -> str | None:
        """The run id `root/current` points at."""
        link = self.links.get(posixpath.join(root, "current"))
        return posixpath.basename(link) if link else None

    def crash(self, run_dir: str, exit_code: int = 1, log: str = "") -> None:
        """The engine of `run_dir` dies now (a test's doing), its last words `log`; the supervisor records the
        crash (`last_crash`) as daemon does."""
        with self._lock:
            path = posixpath.join(run_dir, ENGINE_LOG)
            before = self.files.get(path, b"")
            self._write(path, before + log.encode())
            state = self.states.get(run_dir) or {}
            offset = int(state.get("log_offset") or 0)
            known = state.get("traceback_offset")
            tb = known if known is not None else self._traceback(log, len(before))
            self._end(run_dir, "exited", exit_code)
            ended = self.states[run_dir]
            self._save(run_dir, {**ended, "last_crash": {
                "at": ended.get("ended_at") or time.time(), "exit_code": exit_code, "signal": None,
                "signal_name": None, "log_offset": offset, "traceback_offset": tb}})

    # -- the fake supervisor ----------------------------------------------------------------------------

    def supervise(self, argv: Sequence[str]) -> Result:
        cmd = "supervise " + " ".join(argv)
        with self._lock:
            if not argv:
                return Result(cmd, 2, "", "supervise: no command")
            op, args = argv[0], list(argv[1:])
            if op == "start":
                return self._start(cmd, args[0])
            if op == "status":
                return ok(cmd, json.dumps(self._status(args[0]), sort_keys=True) + "\n")
            if op == "stop":
                before = self._status(args[0])
                if before.get("alive"):
                    self._end(args[0], "stopped", None)
                after = self._status(args[0])   # as supervise.py's stop: the state it left, and whether it ran
                return ok(cmd, json.dumps(dict(after, was_running=bool(before.get("alive"))), sort_keys=True))
            if op == "ports":
                port = int(args[0])
                holder = self.listening.get(port)
                if holder is None:
                    return ok(cmd, f"free {port}\n")
                return Result(cmd, 1, f"busy {port}: pid {self._pid(holder)} (fake-engine) of run {holder}\n", "")
            if op == "listener":
                holder = self.listening.get(int(args[1]))
                ours = None if holder is None else holder == args[0]
                holders = [] if holder is None or ours else [f"pid {self._pid(holder)} of run {holder}"]
                return ok(cmd, json.dumps({"ours": ours, "holders": holders}) + "\n")
        return Result(cmd, 2, "", f"supervise: the fake has no {argv[0]!r}")

    def _pid(self, run_dir: str) -> int:
        return 5000 + [s.run_dir for s in self.started].index(run_dir)

    def _start(self, cmd: str, run_dir: str) -> Result:
        record = self.json_file(posixpath.join(run_dir, PROFILE_JSON)) or {}
        config = self.json_file(posixpath.join(run_dir, "supervise.json")) or {}
        port = config.get("port") if isinstance(config.get("port"), int) else None
        if port is not None and port in self.listening and self.listening[port] != run_dir:
            return Result(cmd, 75, "", f"supervise: port {port} taken by pid {self._pid(self.listening[port])}")
        script = self.engine(len(self.started) + 1, record)
        self.started.append(Started(run_dir, record, script, port))
        pid, now = self._pid(run_dir), time.time()
        log = posixpath.join(run_dir, ENGINE_LOG)
        offset = len(self.files.get(log, b""))
        self._write(log, self.files.get(log, b"") + script.log.encode())
        state: State = {"status": "ready" if script.ready else "exited", "supervisor_pid": SUPERVISOR_PID,
                        "pid": pid, "pgid": pid, "started_at": now, "ready_at": now if script.ready else None,
                        "ended_at": None if script.ready else now, "exit_code": None if script.ready else
                        script.exit_code, "signal": None, "signal_name": None, "restarts": 0, "last_crash": None,
                        "log_offset": offset, "traceback_offset": self._traceback(script.log, offset),
                        "peer_lost": None}
        self._save(run_dir, state)
        if script.ready and port is not None:
            self.listening[port] = run_dir
        return ok(cmd, json.dumps({"pid": pid, "pgid": pid, "started_at": now, "log_offset": offset}) + "\n")

    @staticmethod
    def _traceback(log: str, offset: int) -> int | None:
        at = log.find("Traceback (most recent call last)")
        return None if at < 0 else offset + len(log[:at].encode())

    def _save(self, run_dir: str, state: State) -> None:
        self.states[run_dir] = state
        self._write(posixpath.join(run_dir, STATE_JSON), json.dumps(state, sort_keys=True).encode())

    def _end(self, run_dir: str, status: str, exit_code: int | None) -> None:
        state: State = {**(self.states.get(run_dir) or {}), "status": status, "exit_code": exit_code,
                        "ended_at": time.time()}
        self._save(run_dir, state)
        for port, holder in list(self.listening.items()):
            if holder == run_dir:
                del self.listening[port]

    def _status(self, run_dir: str) -> dict[str, Any]:
        state = self.states.get(run_dir)
        if state is None:
            return {"status": "absent", "alive": False, "supervisor_alive": False}
        live = state.get("status") in ("starting", "running", "ready", "restarting")
        return dict(state, alive=live, supervisor_alive=live)

    def http(self, method: str, port: int, path: str) -> dict[str, Any]:
        """The engine's HTTP as the helper would reach it: 200 from a ready engine on the port, else unreachable."""
        with self._lock:
            if port not in self.listening:
                return {"ok": False, "kind": "unreachable", "error": f"127.0.0.1:{port}: nothing listening"}
            holder = self.listening[port]
            script = next((s.script for s in reversed(self.started) if s.run_dir == holder), None)
        if path == "/v1/completions":
            return self._completion(script is None or script.generates)
        if path == "/metrics":  # the scripted engine exposes no metrics
            return {"ok": True, "status": 404, "headers": [], "body_b64": ""}
        body = b"{}" if path != "/health" else b""
        return {"ok": True, "status": 200, "headers": [["content-type", "application/json"]],
                "body_b64": base64.b64encode(body).decode()}

    @staticmethod
    def _completion(generates: bool) -> dict[str, Any]:
        """A one-token completion as the engines answer it, or the 503 of an engine that generates nothing."""
        if not generates:
            body = json.dumps({"error": {"message": "engine core is dead", "code": 503}}).encode()
            return {"ok": True, "status": 503, "headers": [], "body_b64": base64.b64encode(body).decode()}
        reply = {"object": "text_completion", "choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        return {"ok": True, "status": 200, "headers": [["content-type", "application/json"]],
                "body_b64": base64.b64encode(json.dumps(reply).encode()).decode()}

    # -- the shell the pipeline still sends ---------------------------------------------------------------

    def _default_shell(self) -> None:
        s = self.shell
        s.on(r"^printf %s \"\$HOME\"$", lambda c, _i: ok(c, self.home))
        s.on(r"^command -v ", lambda c, _i: ok(c))
        s.on(r"^find .* -printf", lambda c, _i: ok(c, "0\n"))
        s.on("^" + re.escape(SUPERVISOR_PYTHON) + " ", self._supervisor_program)

    def _supervisor_program(self, cmd: str, _stdin: bytes) -> Result:
        # `PATH/supervise.py ARGV` (a deployment's entry file) or `- supervise ARGV` (this deployer's payload over stdin)
        words = shlex.split(cmd[len(SUPERVISOR_PYTHON):])
        return self.supervise(words[2:] if words[:2] == ["-", "supervise"] else words[1:])

    def _children(self, folder: str) -> list[str]:
        found = {p[len(folder) + 1:].split("/", 1)[0] for p in (*self.dirs, *self.files) if p.startswith(folder + "/")}
        return sorted(found)

    def _remove(self, path: str) -> None:
        for name in [p for p in self.files if p == path or p.startswith(path + "/")]:
            del self.files[name]
        self.dirs -= {d for d in self.dirs if d == path or d.startswith(path + "/")}
        self.links.pop(path, None)

    def _run_records(self, run_dir: str) -> dict[str, Any]:
        return {"profile": self.json_file(posixpath.join(run_dir, PROFILE_JSON)),
                "state": self.json_file(posixpath.join(run_dir, STATE_JSON)),
                "outcome": self.json_file(posixpath.join(run_dir, OUTCOME_JSON)), "unreadable": {}}

    def _env(self, run_dir: str) -> str | None:
        data = self.files.get(posixpath.join(run_dir, "env"))
        return None if data is None else data.decode("utf-8", "replace")

    def snapshot(self, argv: Sequence[str]) -> dict[str, Any]:
        """snapshot's `snapshot ARGV` from the fake's memory (the same JSON shape; no size limits)."""
        root, opts = argv[0].rstrip("/"), list(argv[1:])
        if "--workdir" in opts:
            names = [n for n in self._children(root) if posixpath.join(root, n, "runs") in self.dirs]
            return {"workdir": root, "deployments": {n: self._deployment(posixpath.join(root, n), ["--runs", "0"])
                                                     for n in names}}
        return self._deployment(root, opts)

    def _deployment(self, root: str, opts: list[str]) -> dict[str, Any]:
        def opt(name: str) -> str | None:
            return opts[opts.index(name) + 1] if name in opts else None
        runs_dir = posixpath.join(root, "runs")
        runs, current = self._children(runs_dir), self.current(root)
        wanted, tail = opt("--runs") or "0", opt("--log-tail")
        picked = set(runs if wanted == "all" else runs[len(runs) - int(wanted):] if int(wanted) else [])
        shown = None
        if tail is not None and runs:
            shown = current or runs[-1]
            if "--previous" in opts:
                older = [r for r in runs if r < shown]
                shown = older[-1] if older else None
        picked.update(r for r in (current, shown) if r)
        records = {r: self._run_records(posixpath.join(runs_dir, r)) for r in sorted(picked)}
        status = self._status(posixpath.join(runs_dir, current)) if current else None
        told = None
        if opt("--attempt") == "failed":
            told = next((r for r in reversed(runs) if (records.get(r, {}).get("state") or {}).get("status")
                         in ("exited", "crashloop", "lost") or ((records.get(r, {}).get("outcome") or {})
                                                                .get("outcome") not in (None, "ready"))), None)
        elif current and (status or {}).get("status") in ("exited", "crashloop", "lost"):
            told = current
        log = None
        if shown is not None and tail is not None:
            data = self.files.get(posixpath.join(runs_dir, shown, ENGINE_LOG), b"")
            start = max(len(data) - int(tail), 0)
            log = {"size": len(data), "start": start, "data": base64.b64encode(data[start:]).decode(), "run": shown}
        attempt = None
        if told is not None:
            data = self.files.get(posixpath.join(runs_dir, told, ENGINE_LOG), b"")
            state = (status if told == current else None) or records.get(told, {}).get("state") or {}
            offset = int(state.get("log_offset") or 0)
            attempt = {"size": len(data), "windows": [{"start": offset, "data": base64.b64encode(data[offset:])
                                                       .decode()}], "dmesg": None, "run": told}
        return {"root": root, "exists": runs_dir in self.dirs, "runs": runs, "current": current,
                "records": records, "status": status,
                "env": {r: self._env(posixpath.join(runs_dir, r)) for r in (current, shown, told) if r},
                "log": log, "attempt": attempt, "lock": self._text(posixpath.join(root, "lock")),
                "lock_events": self._text(posixpath.join(root, "lock-events.jsonl")) or ""}

    def _text(self, path: str) -> str | None:
        data = self.files.get(path)
        return None if data is None else data.decode("utf-8", "replace")

    # -- the helper's requests --------------------------------------------------------------------------

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """One helper request -> its reply (without the id)."""
        with self._lock:
            self.requests.append(request)
            op = str(request.get("op"))
            handler = getattr(self, f"_op_{op}", None)
            if handler is None:
                return {"ok": False, "kind": "usage", "error": f"the fake helper has no {op!r}"}
            reply: dict[str, Any] = handler(request)
            return reply

    def _op_run(self, r: dict[str, Any]) -> dict[str, Any]:
        cmd, stdin = str(r["cmd"]), base64.b64decode(r.get("stdin_b64") or "")
        result = self.shell.answer(cmd, stdin)
        if result is None:
            self.unknown.append(cmd)
            result = Result(cmd, 127, "", f"fake: no script for {cmd[:120]!r}")
        return {"ok": True, "exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}

    def _op_install(self, r: dict[str, Any]) -> dict[str, Any]:
        for f in r["files"]:
            self._write(str(f["path"]), base64.b64decode(f["data_b64"]))
        return {"ok": True}

    def _op_read(self, r: dict[str, Any]) -> dict[str, Any]:
        path = str(r["path"])
        if path not in self.files:
            return {"ok": False, "kind": "notfound", "error": f"{path}: no such file"}
        data = self.files[path][int(r.get("offset") or 0):][:int(r.get("limit") or 1 << 20)]
        return {"ok": True, "data_b64": base64.b64encode(data).decode()}

    def _op_size(self, r: dict[str, Any]) -> dict[str, Any]:
        data = self.files.get(str(r["path"]))
        return {"ok": True, "size": None if data is None else len(data)}

    def _op_verify(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "digests": [hashlib.sha256(self.files[p]).hexdigest() if p in self.files else None
                                        for p in r["paths"]]}

    def _op_mkdirs(self, r: dict[str, Any]) -> dict[str, Any]:
        path = str(r["path"])
        while path not in self.dirs and path != "/":
            self.dirs.add(path)
            path = posixpath.dirname(path)
        return {"ok": True}

    def _op_snapshot(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "data": self.snapshot([str(a) for a in r["argv"]])}

    def _op_link(self, r: dict[str, Any]) -> dict[str, Any]:
        self.links[str(r["path"])] = str(r["target"])
        return {"ok": True}

    def _op_readlink(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "target": self.links.get(str(r["path"]))}

    def _op_remove(self, r: dict[str, Any]) -> dict[str, Any]:
        within = str(r["within"]).rstrip("/") + "/"
        if not all(str(p).startswith(within) for p in r["paths"]):
            return {"ok": False, "kind": "unsafe", "error": "a path outside the deployment dir: refused"}
        for path in r["paths"]:
            self._remove(str(path))
        return {"ok": True, "removed": len(r["paths"])}

    def _op_disk(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "free": 100 << 30, "digests": [hashlib.sha256(self.files[p]).hexdigest()
                                                          if p in self.files else None for p in r["files"]]}

    def _op_mkdir(self, r: dict[str, Any]) -> dict[str, Any]:
        path = str(r["path"])
        if path in self.dirs:
            return {"ok": False, "kind": "exists", "error": f"{path} exists already"}
        self.dirs.add(path)
        return {"ok": True, "made": True, "free": 100 << 30}

    def _op_listdir(self, r: dict[str, Any]) -> dict[str, Any]:
        path = str(r["path"])
        names = [n for n in self._children(path) if not n.startswith(".")] if path in self.dirs else None
        return {"ok": True, "names": names}

    def _op_find_bytes(self, r: dict[str, Any]) -> dict[str, Any]:
        data = self.files.get(str(r["path"]))
        if data is None:
            return {"ok": False, "kind": "notfound", "error": f"{r['path']}: no such file"}
        at = data.find(base64.b64decode(r["needle_b64"]), int(r.get("offset") or 0))
        return {"ok": True, "at": None if at < 0 else at}

    def _op_kernel_log(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "text": ""}

    def _op_lease_show(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "lease": {"held": False}}

    def _op_runs(self, r: dict[str, Any]) -> dict[str, Any]:
        """retention's run summary (the helper's `runs`) from the fake's files."""
        runs_dir = str(r["path"])
        out = []
        for rid in self._children(runs_dir):
            d = posixpath.join(runs_dir, rid)
            state = self.json_file(posixpath.join(d, STATE_JSON)) or {}
            outcome = self.json_file(posixpath.join(d, OUTCOME_JSON)) or {}
            record = self.json_file(posixpath.join(d, PROFILE_JSON)) or {}
            out.append({"id": rid, "hash": str(record.get("content_hash", "")),
                        "ready": bool(state.get("ready_at")) or outcome.get("outcome") == "ready",
                        "status": str(state.get("status", "unknown")),
                        "env": posixpath.join(d, "env") in self.files,
                        "payload": named_payload(self.files.get(posixpath.join(d, "supervise.py"), b""))})
        root = posixpath.dirname(runs_dir)
        payloads = [{"digest": name[:-3], "age_s": 0.0} for name in self._children(posixpath.join(root, "payload"))]
        return {"ok": True, "runs": out, "current": self.current(root), "payloads": payloads,
                "root_payload": named_payload(self.files.get(posixpath.join(root, "supervise.py"), b""))}

    def _op_models_prune(self, r: dict[str, Any]) -> dict[str, Any]:
        """The retention of pushed model directories: the fake's targets push none."""
        return {"ok": True, "removed": [], "bytes": 0, "recent": [], "busy": []}

    def _op_http(self, r: dict[str, Any]) -> dict[str, Any]:
        address = str(r.get("address") or "127.0.0.1")
        host = self.peers.get(address) or (self if address in self.addresses else None)   # another fake host, or ours
        if host is None:
            return {"ok": False, "kind": "unreachable", "error": f"{address}:{r['port']}: no route (not a peer)"}
        return host.http(str(r["method"]), int(r["port"]), str(r["path"]))

    def _op_supervise(self, r: dict[str, Any]) -> dict[str, Any]:
        result = self.supervise([str(a) for a in r["argv"]])
        return {"ok": True, "exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}

    def _op_lease_take(self, r: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "word": "LOCKED", "data": {}}

    def _op_lease_beat(self, r: dict[str, Any]) -> dict[str, Any]:
        if r.get("release"):
            return {"ok": True, "word": "RELEASED", "data": {}}
        return {"ok": True, "word": "OK", "data": {"lease_s": 30}}


class FakeSession:
    """The helper's one channel: request lines in, the fake's replies out (the hello first)."""

    def __init__(self, target: FakeRemote) -> None:
        self._target = target
        self._out: deque[str] = deque([json.dumps({"hello": {"version": payload_bundle()[1], "fake": True}})])
        self._ready = threading.Condition()
        self._closed = False

    def send(self, data: bytes) -> None:
        if self._closed:
            raise RemoteError("session closed", host=FAKE)
        for line in data.decode().splitlines():
            request = json.loads(line)
            reply = self._target.answer(request)
            with self._ready:
                self._out.append(json.dumps({"id": request["id"], **reply}))
                self._ready.notify_all()

    def readline(self, timeout: float) -> str | None:
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._out) or self._closed, timeout):
                raise NoLine(f"no output line within {timeout:g}s", host=FAKE)
            return self._out.popleft() if self._out else None

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()


def _conforms(fake: FakeRemote) -> Transport:
    """Never called: mypy checks here that the fake is a transport like the real ones."""
    return fake
