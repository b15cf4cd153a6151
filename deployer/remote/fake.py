"""`FakeRemote`: a scripted box for unit tests, with the real helper answering over an in-process pipe, as httpx's
MockTransport wraps a handler.

It is a transport like SSHRemote and LocalRemote: the helper conversation (remote/conversation.py) spawns its
helper on it and speaks the real line-delimited JSON protocol, so everything above the seam runs unchanged. What
answers is the real helper (deployer/supervisor/helper.py's `Helper`, in this process) on a real directory: files,
links, run dirs, the deployment lock's lease, retention's summaries and snapshots are the helper's own ops on the
test's files, with their checks (a path another user controls, a symlink on the way, a sha256 that does not match).
Only what would start a process or reach a network is scripted (`ScriptedHelper`): a fake supervisor that
"starts" an engine whose log and fate the test gives (`EngineScript`, chosen per start by `FakeRemote.engine`) and
writes its state.json as the daemon does, the engine's HTTP on its port (and other fake hosts' as peers), the kernel
log, and the shell lines the pipeline still sends (`FakeShell`'s table of patterns). A command nobody scripted fails
with exit 127 and is kept in `unknown`; an op that would open a socket or start a program is refused, so a test
sees a step that started sending something new.

Nothing here starts a process or touches the network: a whole `up` runs in milliseconds, on the test's own files.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import shlex
import shutil
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import RemoteError
from deployer.remote.base import Hasher, HttpReply, NoLine, Result
from deployer.remote.program import SUPERVISOR_PYTHON, payload_bundle
from deployer.supervisor.helper import Helper, RequestError
from deployer.supervisor.protocol import ENGINE_LOG, PROFILE_JSON, STATE_JSON, State

FAKE = "fake"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
SUPERVISOR_PID = 4000
# Ops the scripted box refuses: each would open a socket or start a program on the box.
REFUSED_OPS = ("listen", "reach", "env_build", "fetch", "push")


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
    """The scripted box (see the module's docstring). `engine(started_count, record) -> EngineScript`; `home`: the
    box's $HOME (a real directory; default: a new temporary one, removed with the box), where a `~/...` workdir
    lives: each fake host has files of its own."""

    label = FAKE    # a transport: its helper requests are the Conversation's opened on it

    def __init__(self, engine: Callable[[int, dict[str, Any]], EngineScript] | None = None,
                 home: str | None = None) -> None:
        self.engine = engine or (lambda _n, _record: EngineScript.serving())
        if home is None:
            home = tempfile.mkdtemp(prefix="deployer-fake-home-")
            weakref.finalize(self, shutil.rmtree, home, True)   # the box's files go with the box
        self.home = home
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
        raise RemoteError("the fake takes uploads through its helper only (`install`)", host=FAKE)

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        raise RemoteError("the fake reads through its helper only (`read`)", host=FAKE)

    def run(self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None) -> Result:
        raise RemoteError("the fake answers commands through its helper only (open a Conversation on it)", host=FAKE)

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> HttpReply:
        raise RemoteError("the fake answers HTTP through its helper only (open a Conversation on it)", host=FAKE)

    def close(self) -> None:
        pass

    # -- the box's files, for a test's assertions -------------------------------------------------------------

    @staticmethod
    def json_file(path: str) -> dict[str, Any] | None:
        try:
            with open(path, "rb") as f:
                return dict(json.loads(f.read()))
        except FileNotFoundError:
            return None

    @staticmethod
    def current(root: str) -> str | None:
        """The run id `root/current` points at."""
        try:
            return posixpath.basename(os.readlink(posixpath.join(root, "current")))
        except OSError:
            return None

    # -- the fake supervisor ----------------------------------------------------------------------------

    def crash(self, run_dir: str, exit_code: int = 1, log: str = "") -> None:
        """The engine of `run_dir` dies now (a test's doing), its last words `log`; the supervisor records the
        crash (`last_crash`) as daemon does."""
        with self._lock:
            before = self._append_log(run_dir, log)
            state = self.states.get(run_dir) or {}
            offset = int(state.get("log_offset") or 0)
            known = state.get("traceback_offset")
            tb = known if known is not None else self._traceback(log, before)
            self._end(run_dir, "exited", exit_code)
            ended = self.states[run_dir]
            self._save(run_dir, {**ended, "last_crash": {
                "at": ended.get("ended_at") or time.time(), "exit_code": exit_code, "signal": None,
                "signal_name": None, "log_offset": offset, "traceback_offset": tb}})

    def supervise(self, argv: Sequence[str]) -> Result:
        cmd = "supervise " + " ".join(argv)
        with self._lock:
            if not argv:
                return Result(cmd, 2, "", "supervise: no command")
            op, args = argv[0], list(argv[1:])
            if op == "start":
                return self._start(cmd, args[0])
            if op == "status":
                return ok(cmd, json.dumps(self.status(args[0]), sort_keys=True) + "\n")
            if op == "stop":
                before = self.status(args[0])
                if before.get("alive"):
                    self._end(args[0], "stopped", None)
                after = self.status(args[0])   # as supervise.py's stop: the state it left, and whether it ran
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

    def status(self, run_dir: str) -> dict[str, Any]:
        """What `supervise.py status` says of `run_dir`: its state, alive while the script says it runs."""
        state = self.states.get(run_dir)
        if state is None:
            return {"status": "absent", "alive": False, "supervisor_alive": False}
        live = state.get("status") in ("starting", "running", "ready", "restarting")
        return dict(state, alive=live, supervisor_alive=live)

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
        offset = self._append_log(run_dir, script.log)
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
    def _append_log(run_dir: str, text: str) -> int:
        """Append `text` to the run's engine.log (as the engine prints); the log's size before it."""
        with open(posixpath.join(run_dir, ENGINE_LOG), "ab") as f:
            before = f.tell()
            f.write(text.encode())
        return before

    @staticmethod
    def _traceback(log: str, offset: int) -> int | None:
        at = log.find("Traceback (most recent call last)")
        return None if at < 0 else offset + len(log[:at].encode())

    def _save(self, run_dir: str, state: State) -> None:
        self.states[run_dir] = state
        tmp = posixpath.join(run_dir, f".{STATE_JSON}.tmp")
        with open(tmp, "w") as f:
            json.dump(state, f, sort_keys=True)
        os.replace(tmp, posixpath.join(run_dir, STATE_JSON))

    def _end(self, run_dir: str, status: str, exit_code: int | None) -> None:
        state: State = {**(self.states.get(run_dir) or {}), "status": status, "exit_code": exit_code,
                        "ended_at": time.time()}
        self._save(run_dir, state)
        for port, holder in list(self.listening.items()):
            if holder == run_dir:
                del self.listening[port]

    # -- the engine's HTTP --------------------------------------------------------------------------------

    def http(self, method: str, port: int, path: str) -> dict[str, Any]:
        """The engine's HTTP as the helper would reach it: 200 from a ready engine on the port, else unreachable."""
        with self._lock:
            if port not in self.listening:
                raise RequestError(f"127.0.0.1:{port}: nothing listening", "unreachable")
            holder = self.listening[port]
            script = next((s.script for s in reversed(self.started) if s.run_dir == holder), None)
        if path == "/v1/completions":
            return self._completion(script is None or script.generates)
        if path == "/metrics":  # the scripted engine exposes no metrics
            return {"status": 404, "headers": [], "body_b64": ""}
        body = b"{}" if path != "/health" else b""
        return {"status": 200, "headers": [["content-type", "application/json"]],
                "body_b64": base64.b64encode(body).decode()}

    @staticmethod
    def _completion(generates: bool) -> dict[str, Any]:
        """A one-token completion as the engines answer it, or the 503 of an engine that generates nothing."""
        if not generates:
            body = json.dumps({"error": {"message": "engine core is dead", "code": 503}}).encode()
            return {"status": 503, "headers": [], "body_b64": base64.b64encode(body).decode()}
        reply = {"object": "text_completion", "choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        return {"status": 200, "headers": [["content-type", "application/json"]],
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

    def shell_line(self, cmd: str, stdin: bytes) -> Result:
        result = self.shell.answer(cmd, stdin)
        if result is None:
            self.unknown.append(cmd)
            result = Result(cmd, 127, "", f"fake: no script for {cmd[:120]!r}")
        return result


class ScriptedHelper(Helper):
    """The real helper, in this process, with the box's processes and network scripted by its FakeRemote: `run`
    (the shell table), `supervise` (the fake supervisor), `http` (the scripted engines, this host's or a peer's),
    the kernel log, and a run's live status in snapshots; the ops that would open a socket or start a program are
    refused. Every other op is the helper's own, on real files."""

    def __init__(self, box: FakeRemote, out: Any) -> None:
        super().__init__(out)
        self.box = box
        self.ops["kernel_log"] = lambda _req: {"text": ""}
        for name in REFUSED_OPS:
            self.ops[name] = self._refused

    @staticmethod
    def _refused(req: dict[str, Any]) -> dict[str, Any]:
        raise RequestError(f"the fake box does not {req.get('op')} (it would open a socket or start a program)",
                           "usage")

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        result = self.box.shell_line(str(req["cmd"]), base64.b64decode(req.get("stdin_b64") or ""))
        return {"exit_code": result.exit_code, "timed_out": False, "stdout": result.stdout, "stderr": result.stderr}

    def supervise(self, req: dict[str, Any]) -> dict[str, Any]:
        result = self.box.supervise([str(a) for a in req["argv"]])
        return {"exit_code": result.exit_code, "timed_out": False, "stdout": result.stdout, "stderr": result.stderr}

    def live_status(self, run_dir: str) -> dict[str, Any]:
        return self.box.status(run_dir)

    def snapshot(self, req: dict[str, Any]) -> dict[str, Any]:
        argv = [str(a) for a in req["argv"]]   # `~/x` is the box's home, as the helper there expands it
        if argv and (argv[0] == "~" or argv[0].startswith("~/")):
            argv[0] = self.box.home + argv[0][1:]
        return super().snapshot(dict(req, argv=argv))

    def http(self, req: dict[str, Any]) -> dict[str, Any]:
        address = str(req.get("address") or "127.0.0.1")
        box = self.box
        host = box.peers.get(address) or (box if address in box.addresses else None)   # another fake host, or ours
        if host is None:
            raise RequestError(f"{address}:{req['port']}: no route (not a peer)", "unreachable")
        return host.http(str(req["method"]), int(req["port"]), str(req["path"]))


class _Lines:
    """The helper's stdout: each reply line it writes becomes one line the session reads."""

    def __init__(self, session: FakeSession) -> None:
        self._session = session
        self._partial = b""

    def write(self, data: bytes) -> int:
        self._partial += data
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            self._session.put_line(line.decode())
        return len(data)

    def flush(self) -> None:
        pass


class FakeSession:
    """The helper's one channel: request lines in, the helper's replies out (the hello first)."""

    def __init__(self, box: FakeRemote) -> None:
        self._box = box
        self._out: deque[str] = deque([json.dumps({"hello": {"version": payload_bundle()[1], "fake": True}})])
        self._ready = threading.Condition()
        self._closed = False
        self._helper = ScriptedHelper(box, _Lines(self))

    def send(self, data: bytes) -> None:
        if self._closed:
            raise RemoteError("session closed", host=FAKE)
        for line in data.decode().splitlines():
            with self._box._lock:
                self._box.requests.append(json.loads(line))
                self._helper.handle(line.encode())

    def put_line(self, line: str) -> None:
        with self._ready:
            self._out.append(line)
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
