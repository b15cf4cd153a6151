#!/usr/bin/env python3
"""The supervisor deployer pushes into every run dir; it runs on the TARGET with its system python3.

Stdlib only, Python >= 3.8.  `python3 supervise.py CMD ...`:
  start RUN_DIR              detach a daemon that runs launch.sh in its own process group; print state JSON
  stop RUN_DIR [--grace S]   SIGTERM the engine group, SIGKILL after the grace; print the final state JSON
  status RUN_DIR             print state.json plus "alive" / "supervisor_alive" ("lost" when both are gone)
  lock LOCK_PATH --who TEXT  hold the per-deployment flock until stdin closes (LOCKED, or BUSY + exit 75)
  ports PORT                 exit 0 if PORT is free on 127.0.0.1 and 0.0.0.0, else 1 and who holds it
State: starting -> running -> ready [-> restarting -> running ...] -> stopped | exited | crashloop.
Bad input exits 2, other failures 1, always with one line on stderr.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable

STATE, STOP_REQUEST, RUN_LOCK = "state.json", "stop-request.json", "supervise.lock"
LIVE = ("starting", "running", "ready", "restarting", "stopping")
POLICIES = ("no", "on-failure", "always")
TICK, SCAN_EVERY, START_TIMEOUT, KILL_WAIT = 0.05, 0.5, 10.0, 5.0
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUSY = 1, 2, 75
DEFAULTS: dict[str, Any] = {"launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": 30,
                            "ready_pattern": "The server is fired up and ready to roll!"}
DEFAULT_RESTART: dict[str, Any] = {"policy": "no", "max": 5, "backoff_s": [10, 300], "window_s": 600}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SuperviseError(Exception):
    """An expected failure: reported as one stderr line and exit `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def read_env_file(path: str) -> dict[str, str]:
    """Parses the run's env file: shell words NAME='value' (values may hold newlines), # comments."""
    try:
        with open(path, encoding="utf-8", newline="") as f:  # keep \r in values as written
            text = f.read()
    except OSError as e:
        raise SuperviseError(f"cannot read env file {path}: {e.strerror}", EXIT_BAD_INPUT) from None
    except UnicodeDecodeError as e:
        raise SuperviseError(f"env file {path} is not valid shell words: {e}", EXIT_BAD_INPUT) from None
    return parse_env_text(text, path)


def parse_env_text(text: str, path: str = "env") -> dict[str, str]:
    """The env file's text -> {NAME: value}; entries that are not NAME=value are errors (never echoed)."""
    try:
        words = shlex.split(text, comments=True, posix=True)
    except ValueError as e:
        raise SuperviseError(f"env file {path} is not valid shell words: {e}", EXIT_BAD_INPUT) from None
    env: dict[str, str] = {}
    for i, word in enumerate(words, 1):
        name, eq, value = word.partition("=")
        if word == "export":
            continue
        if not eq or not _ENV_NAME.match(name):  # never echo the word: it may be a secret
            raise SuperviseError(f"env file {path}: entry {i} is not NAME=value", EXIT_BAD_INPUT)
        env[name] = value
    return env


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise SuperviseError(f"bad supervise.json: {what}", EXIT_BAD_INPUT)


def load_config(run_dir: str) -> dict[str, Any]:
    """Reads and checks RUN_DIR/supervise.json, filling defaults."""
    try:
        with open(os.path.join(run_dir, "supervise.json"), encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as e:
        raise SuperviseError(f"cannot read {run_dir}/supervise.json: {e.strerror}", EXIT_BAD_INPUT) from None
    except ValueError as e:
        raise SuperviseError(f"{run_dir}/supervise.json is not JSON: {e}", EXIT_BAD_INPUT) from None
    _need(isinstance(raw, dict), "top level must be an object")
    cfg = dict(DEFAULTS, **raw)
    _need(isinstance(cfg.get("restart", {}), dict), "restart must be an object")
    cfg["restart"] = rs = dict(DEFAULT_RESTART, **cfg.get("restart", {}))
    _need(isinstance(cfg["launch"], str) and os.path.isfile(os.path.join(run_dir, cfg["launch"])),
          f"launch script {cfg['launch']!r} not found in the run dir")
    _need(cfg["env_file"] is None or isinstance(cfg["env_file"], str), "env_file must be a string or null")
    _need(isinstance(cfg["log"], str) and bool(cfg["log"]), "log must be a file name")
    _need(_number(cfg["grace_s"]) and cfg["grace_s"] >= 0, "grace_s must be a number >= 0")
    _need(cfg["ready_pattern"] is None or (isinstance(cfg["ready_pattern"], str) and bool(cfg["ready_pattern"])),
          "ready_pattern must be a non-empty string or null")
    _need(rs["policy"] in POLICIES, f"restart.policy must be one of {', '.join(POLICIES)}")
    _need(isinstance(rs["max"], int) and not isinstance(rs["max"], bool) and rs["max"] >= 0,
          "restart.max must be an integer >= 0")
    b = rs["backoff_s"]
    _need(isinstance(b, list) and len(b) == 2 and all(_number(x) and x >= 0 for x in b),
          "restart.backoff_s must be [initial, maximum] seconds")
    _need(_number(rs["window_s"]) and rs["window_s"] > 0, "restart.window_s must be a number > 0")
    return cfg


def backoff_delay(backoff_s: list[float], recent_restarts: int) -> float:
    """Exponential backoff: initial * 2**n, capped at the maximum."""
    first, cap = backoff_s
    return float(min(first * (2 ** min(recent_restarts, 60)), cap))


def should_restart(policy: str, exit_code: int | None) -> bool:
    """Whether the policy restarts an engine that ended after it was ready (exit_code None = by signal)."""
    return policy == "always" or (policy == "on-failure" and exit_code != 0)


def signal_name(num: int | None) -> str | None:
    if num is None:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def decode_wait_status(status: int) -> tuple[int | None, int | None]:
    """(exit_code, signal) from a waitpid status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic write: temp file, fsync, rename."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(run_dir, STATE), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SuperviseError(f"unreadable {run_dir}/{STATE}: {e}") from None
    return data if isinstance(data, dict) else None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc, or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: Any) -> bool:
    """True for a live process; a zombie (nobody reaped it yet) counts as dead."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    st = _proc_stat(pid)
    if st is None:
        return not os.path.isdir("/proc/self")
    return st[0] not in ("Z", "X")


def supervisor_alive(pid: Any) -> bool:
    """pid_alive, and (where /proc tells) the process is a supervise.py, not a reused pid."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"supervise" in f.read()
    except OSError:
        return True


def group_alive(pgid: Any) -> bool:
    """True while any non-zombie process is in the group (killpg(pgid, 0) alone also sees zombies)."""
    if not isinstance(pgid, int) or pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc/self"):
        return True
    for name in os.listdir("/proc"):
        st = _proc_stat(int(name)) if name.isdigit() else None
        if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
            return True
    return False


def kill_group(pgid: Any, sig: int) -> None:
    if isinstance(pgid, int) and pgid > 1:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def note(message: str) -> None:
    """One timestamped line in supervisor.log (the daemon's stdout)."""
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


def wait_until(done: Callable[[], bool], timeout: float, tick: float = TICK) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(tick)
    return True


class LogScanner:
    """Reads a log from a byte offset on, only what is new and in bounded chunks, and notes two things:
    whether the ready pattern appeared, and the offset of the first traceback (so the deployer can read the
    window that matters from a log of any size without scanning it again)."""

    CHUNK = 4 << 20
    TRACEBACK = b"Traceback (most recent call last)"

    def __init__(self, path: str, pattern: str | None, offset: int) -> None:
        self.path, self.pos, self.carry = path, offset, b""
        self.needle = pattern.encode() if pattern else None
        self.ready = False
        self.traceback_at: int | None = None

    def scan(self, budget: int = 64 << 20) -> None:
        """Read up to `budget` new bytes (the rest on the next call)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                while budget > 0:
                    chunk = f.read(min(self.CHUNK, budget))
                    if not chunk:
                        return
                    budget -= len(chunk)
                    self._look(chunk)
        except OSError:
            return

    def _look(self, chunk: bytes) -> None:
        data, base = self.carry + chunk, self.pos - len(self.carry)
        self.pos += len(chunk)
        if self.needle is not None and not self.ready and self.needle in data:
            self.ready = True
        if self.traceback_at is None:
            at = data.find(self.TRACEBACK)
            if at >= 0:
                self.traceback_at = base + at
        keep = max(len(self.needle or b""), len(self.TRACEBACK)) - 1  # a needle split across two reads
        self.carry = data[-keep:]

    def found(self) -> bool:
        self.scan()
        return self.ready


class Daemon:
    """The detached supervisor: runs the engine, records its state, restarts it per policy."""

    def __init__(self, run_dir: str, cfg: dict[str, Any], env: dict[str, str], report_fd: int) -> None:
        self.run_dir, self.cfg, self.env = run_dir, cfg, env
        self.report_fd: int | None = report_fd
        self.log = os.path.join(run_dir, cfg["log"])
        self.engine_pid: int | None = None
        self.exit_status: int | None = None
        self.stop_requested = False
        self.restart_times: list[float] = []
        self.scanner = LogScanner(self.log, None, 0)
        self.next_scan = 0.0
        self.state: dict[str, Any] = {
            "status": "starting", "supervisor_pid": os.getpid(), "pid": None, "pgid": None,
            "started_at": None, "ready_at": None, "ended_at": None, "exit_code": None, "signal": None,
            "signal_name": None, "restarts": 0, "last_crash": None, "log_offset": 0,
            "traceback_offset": None}

    def save(self) -> None:
        self.state["updated_at"] = time.time()
        write_json(os.path.join(self.run_dir, STATE), self.state)

    def report(self, line: str) -> None:
        if self.report_fd is not None:
            try:
                os.write(self.report_fd, line.encode() + b"\n")
                os.close(self.report_fd)
            except OSError:
                pass
            self.report_fd = None

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, lambda *_: None)
        _become_subreaper()
        self.save()
        self.spawn()
        self.report(json.dumps(self.state, sort_keys=True))
        while True:
            if self.stop_requested:
                self.stop()
                return 0
            self.reap()
            if self.exit_status is not None:
                if not self.handle_exit():
                    return 0
            elif self.state["status"] in ("running", "ready") and time.monotonic() >= self.next_scan:
                self.check_ready()
            time.sleep(TICK)

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def spawn(self) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        if os.fstat(fd).st_size > 0:
            what = f"restart {self.state['restarts']}" if self.state["restarts"] else "start"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            os.write(fd, f"\n==== deployer supervisor: {what} at {stamp} ====\n".encode())
        offset = os.fstat(fd).st_size
        env = dict(os.environ, **self.env, DEPLOYER_RUN_DIR=self.run_dir)
        bash = shutil.which("bash") or "/bin/bash"
        pid = os.fork()
        if pid == 0:
            _exec_engine(fd, bash, os.path.join(self.run_dir, self.cfg["launch"]), env)
        os.close(fd)
        try:
            os.setpgid(pid, pid)  # also in the child: whichever runs first wins the race
        except OSError:
            pass
        self.engine_pid, self.exit_status = pid, None
        self.scanner = LogScanner(self.log, self.cfg["ready_pattern"], offset)
        note(f"engine started: pid {pid}, log offset {offset}")
        self.state.update(status="running", pid=pid, pgid=pid, started_at=time.time(), ready_at=None,
                          ended_at=None, exit_code=None, signal=None, signal_name=None, log_offset=offset,
                          traceback_offset=None)
        self.save()

    def reap(self) -> None:
        for _ in range(1000):  # the engine and, as subreaper, its orphans
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.engine_pid:
                self.exit_status = status

    def check_ready(self) -> None:
        self.next_scan = time.monotonic() + SCAN_EVERY
        had_traceback = self.scanner.traceback_at
        if self.scanner.found() and self.state["status"] == "running":
            self.state.update(status="ready", ready_at=time.time())
            self.save()
        if self.scanner.traceback_at != had_traceback:
            self.state["traceback_offset"] = self.scanner.traceback_at
            self.save()

    def record_end(self, status: int | None) -> None:
        code, sig = decode_wait_status(status) if status is not None else (None, None)
        self.state.update(ended_at=time.time(), exit_code=code, signal=sig, signal_name=signal_name(sig))
        self.engine_pid = self.exit_status = None

    def handle_exit(self) -> bool:
        """Records the engine's end and restarts it if the policy says so; False when the daemon is done."""
        for _ in range(1000):  # its last words: the whole rest of the log, however big (bounded passes)
            before = self.scanner.pos
            self.check_ready()
            if self.scanner.pos == before:
                break
        was_ready = self.state["status"] == "ready"
        self.record_end(self.exit_status)
        note(f"engine ended: exit code {self.state['exit_code']}, signal {self.state['signal_name']}")
        self.clear_group(self.state["pgid"])
        s, rs = self.state, self.cfg["restart"]
        s["last_crash"] = {"at": s["ended_at"], "exit_code": s["exit_code"], "signal": s["signal"],
                           "signal_name": s["signal_name"], "log_offset": s["log_offset"],
                           "traceback_offset": self.scanner.traceback_at}
        if not (was_ready and should_restart(rs["policy"], s["exit_code"])):
            return self.finish("exited")
        now = time.time()
        recent = [t for t in self.restart_times if now - t < rs["window_s"]]
        if len(recent) >= rs["max"]:
            return self.finish("crashloop")
        s["status"] = "restarting"
        self.save()
        delay = backoff_delay(rs["backoff_s"], len(recent))
        note(f"restarting in {delay:g} s ({len(recent)} restarts in the last {rs['window_s']:g} s)")
        if not self.sleep(delay):
            return self.finish("stopped")
        self.restart_times = recent + [time.time()]
        s["restarts"] += 1
        self.spawn()
        return True

    def sleep(self, seconds: float) -> bool:
        """Backoff wait that reaps and gives way to a stop request (then False)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stop_requested:
                return False
            self.reap()
            time.sleep(TICK)
        return not self.stop_requested

    def clear_group(self, pgid: Any) -> None:
        """Leftover children of an engine that ended still hold GPU memory: end them too."""
        if group_alive(pgid):
            kill_group(pgid, signal.SIGTERM)
            if not self.wait_group(pgid, min(float(self.cfg["grace_s"]), KILL_WAIT)):
                kill_group(pgid, signal.SIGKILL)
                self.wait_group(pgid, KILL_WAIT)

    def wait_group(self, pgid: Any, timeout: float) -> bool:
        def gone() -> bool:
            self.reap()
            return (self.engine_pid is None or self.exit_status is not None) and not group_alive(pgid)
        return wait_until(gone, timeout)

    def stop(self) -> None:
        self.state["status"] = "stopping"
        self.save()
        grace = float(self.cfg["grace_s"])
        try:
            with open(os.path.join(self.run_dir, STOP_REQUEST), encoding="utf-8") as f:
                grace = float(json.load(f)["grace_s"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        pgid = self.state["pgid"]
        note(f"stop requested: SIGTERM to group {pgid}, SIGKILL after {grace:g} s")
        if self.engine_pid is not None:
            kill_group(pgid, signal.SIGTERM)
            if not self.wait_group(pgid, grace):
                kill_group(pgid, signal.SIGKILL)
                self.wait_group(pgid, KILL_WAIT)
            self.record_end(self.exit_status)
        else:
            self.clear_group(pgid)
        self.finish("stopped")

    def finish(self, status: str) -> bool:
        note(f"supervisor done: {status}")
        self.state["status"] = status
        self.save()
        try:
            os.unlink(os.path.join(self.run_dir, STOP_REQUEST))
        except OSError:
            pass
        return False


def _exec_engine(log_fd: int, bash: str, launch: str, env: dict[str, str]) -> None:
    """In the forked child: own process group, default signals, stdio to the log, exec bash launch.sh."""
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.execve(bash, [bash, launch], env)
    except BaseException as e:
        os.write(2, f"deployer supervisor: cannot run {launch}: {e}\n".encode())
    os._exit(127)


def _become_subreaper() -> None:
    """Orphans of the engine are reparented to us (and reaped), not to an init that may not reap."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _close_fds_except(keep: list[int]) -> None:
    """Any inherited descriptor (an SSH channel's pipe) would hold the caller open: close all but ours."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _daemon_main(run_dir: str, cfg: dict[str, Any], env: dict[str, str], keep: list[int]) -> None:
    code, report_fd = EXIT_FAILED, keep[0]
    daemon = None
    try:
        _close_fds_except(keep)
        os.chdir(run_dir)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        out = os.open(os.path.join(run_dir, "supervisor.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        os.dup2(out, 1)
        os.dup2(out, 2)
        daemon = Daemon(run_dir, cfg, env, report_fd)
        code = daemon.run()
    except BaseException:
        traceback.print_exc()
        line = "ERR supervisor crashed; see supervisor.log"
        if daemon is not None:
            daemon.report(line)
        else:
            os.write(report_fd, line.encode() + b"\n")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _take_run_lock(run_dir: str) -> int:
    fd = os.open(os.path.join(run_dir, RUN_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        pid = (read_state(run_dir) or {}).get("supervisor_pid")
        raise SuperviseError(f"a supervisor is already running in {run_dir} (pid {pid})") from None
    return fd


def _read_report(fd: int, timeout: float) -> str:
    deadline, buf = time.monotonic() + timeout, b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SuperviseError(f"supervisor did not start the engine within {timeout:g} s; see supervisor.log")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise SuperviseError("supervisor exited before starting the engine; see supervisor.log")
        buf += chunk
    return buf.split(b"\n", 1)[0].decode()


def cmd_start(run_dir: str) -> int:
    cfg = load_config(run_dir)
    env = read_env_file(os.path.join(run_dir, cfg["env_file"])) if cfg["env_file"] else {}
    lock_fd = _take_run_lock(run_dir)  # inherited by the daemon, held for its whole life
    old = read_state(run_dir) or {}
    if group_alive(old.get("pgid")):
        os.close(lock_fd)
        raise SuperviseError(f"engine group {old['pgid']} of an earlier supervisor is still alive; stop it first")
    for stale in (STATE, STOP_REQUEST):
        if os.path.exists(os.path.join(run_dir, stale)):
            os.unlink(os.path.join(run_dir, stale))
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() == 0:
                _daemon_main(run_dir, cfg, env, [write_fd, lock_fd])
        finally:
            os._exit(0)
    os.close(write_fd)
    os.close(lock_fd)
    os.waitpid(child, 0)
    line = _read_report(read_fd, START_TIMEOUT)
    if line.startswith("ERR "):
        raise SuperviseError(line[4:])
    print(line, flush=True)
    return 0


def status_of(run_dir: str) -> dict[str, Any]:
    """state.json plus liveness; a live-looking state whose daemon and group are gone is "lost"."""
    state = read_state(run_dir)
    if state is None:
        return {"status": "absent", "alive": False, "supervisor_alive": False}
    state["alive"] = group_alive(state.get("pgid"))
    state["supervisor_alive"] = supervisor_alive(state.get("supervisor_pid"))
    if state.get("status") in LIVE and not state["alive"] and not state["supervisor_alive"]:
        state["status"] = "lost"
    return state


def cmd_status(run_dir: str) -> int:
    print(json.dumps(status_of(run_dir), sort_keys=True), flush=True)
    return 0


def cmd_stop(run_dir: str, grace: float | None) -> int:
    if grace is None:
        try:
            grace = float(load_config(run_dir)["grace_s"])
        except SuperviseError:
            grace = float(DEFAULTS["grace_s"])
    before = status_of(run_dir)
    sup, pgid = before.get("supervisor_pid"), before.get("pgid")
    if not before["alive"] and not before["supervisor_alive"]:
        print(json.dumps(dict(before, was_running=False), sort_keys=True), flush=True)
        return 0
    if before["supervisor_alive"] and isinstance(sup, int):
        write_json(os.path.join(run_dir, STOP_REQUEST), {"grace_s": grace})
        try:
            os.kill(sup, signal.SIGTERM)
        except ProcessLookupError:
            pass
        wait_until(lambda: not supervisor_alive(sup) and not group_alive(pgid), grace + KILL_WAIT)
    elif before["alive"]:  # the daemon is gone: the group is ours to end
        kill_group(pgid, signal.SIGTERM)
        wait_until(lambda: not group_alive(pgid), grace)
    if group_alive(pgid):
        kill_group(pgid, signal.SIGKILL)
        if not wait_until(lambda: not group_alive(pgid), KILL_WAIT):
            raise SuperviseError(f"engine process group {pgid} survived SIGKILL")
    state = read_state(run_dir) or {}
    if state.get("status") in LIVE:  # nobody left to write the final state
        state.update(status="stopped", ended_at=time.time(), updated_at=time.time())
        write_json(os.path.join(run_dir, STATE), state)
    print(json.dumps(dict(status_of(run_dir), was_running=True), sort_keys=True), flush=True)
    return 0


def _lock_holder(fd: int) -> dict[str, Any]:
    text = b""
    for _ in range(20):  # the holder writes its info just after taking the lock
        text = os.pread(fd, 65536, 0)
        if text.strip():
            break
        time.sleep(0.01)
    try:
        info = json.loads(text.decode("utf-8", "replace"))
        return info if isinstance(info, dict) else {"raw": str(info)}
    except ValueError:
        return {"raw": text.decode("utf-8", "replace")[:200]}


def cmd_lock(path: str, who: str) -> int:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SuperviseError(f"cannot open lock {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("BUSY " + json.dumps(_lock_holder(fd), sort_keys=True), flush=True)
        return EXIT_BUSY
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"who": who, "since": time.time(), "pid": os.getpid()}).encode(), 0)
    os.fsync(fd)
    print("LOCKED", flush=True)
    try:
        while os.read(0, 65536):  # held until the deployer's channel (our stdin) closes
            pass
    except OSError:
        pass
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return 0


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not busy
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _port_holders(port: int) -> list[str]:
    """Best effort from /proc: 'pid N (comm)' for listeners on port (needs rights to read their fds)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        inodes |= {r[9] for r in rows if len(r) > 9 and r[3] == "0A" and int(r[1].rsplit(":", 1)[1], 16) == port}
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()) if inodes else ():
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            if any(f"socket:[{i}]" in links for i in inodes):
                with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                    found.append(f"pid {pid} ({f.read().strip()})")
        except OSError:
            continue
    return found


def cmd_ports(port: int) -> int:
    if not 0 < port < 65536:
        raise SuperviseError(f"bad port {port}", EXIT_BAD_INPUT)
    if all(_can_bind(host, port) for host in ("127.0.0.1", "0.0.0.0")):
        print(f"free {port}", flush=True)
        return 0
    print(f"busy {port}: {', '.join(_port_holders(port)) or 'holder unknown'}", flush=True)
    return 1


def _run_dir(arg: str) -> str:
    path = os.path.abspath(arg)
    if not os.path.isdir(path):
        raise SuperviseError(f"no such run dir: {arg}", EXIT_BAD_INPUT)
    return path


def _parse(argv: list[str]) -> tuple[str, list[str], dict[str, str]]:
    """Tiny parser: (command, positionals, --options); argparse would print usage over several lines."""
    if not argv:
        raise SuperviseError("usage: supervise.py start|stop|status|lock|ports ...", EXIT_BAD_INPUT)
    pos, opts, rest = [], {}, list(argv[1:])
    while rest:
        word = rest.pop(0)
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if not eq:
                if not rest:
                    raise SuperviseError(f"--{name} needs a value", EXIT_BAD_INPUT)
                value = rest.pop(0)
            opts[name] = value
        else:
            pos.append(word)
    return argv[0], pos, opts


def dispatch(argv: list[str]) -> int:
    cmd, pos, opts = _parse(argv)
    allowed = {"start": (), "status": (), "stop": ("grace",), "lock": ("who",), "ports": ()}
    if cmd not in allowed:
        raise SuperviseError(f"unknown command {cmd!r} (start|stop|status|lock|ports)", EXIT_BAD_INPUT)
    if len(pos) != 1 or set(opts) - set(allowed[cmd]):
        raise SuperviseError(f"usage: supervise.py {cmd} ARG {' '.join('--' + o + ' X' for o in allowed[cmd])}",
                             EXIT_BAD_INPUT)
    try:
        grace = float(opts["grace"]) if "grace" in opts else None
        port = int(pos[0]) if cmd == "ports" else 0
    except ValueError:
        raise SuperviseError(f"{cmd}: not a number: {opts.get('grace', pos[0])}", EXIT_BAD_INPUT) from None
    if cmd == "lock":
        return cmd_lock(pos[0], opts.get("who", f"pid {os.getpid()}"))
    if cmd == "ports":
        return cmd_ports(port)
    run_dir = _run_dir(pos[0])
    return cmd_start(run_dir) if cmd == "start" else cmd_stop(run_dir, grace) if cmd == "stop" \
        else cmd_status(run_dir)


def main(argv: list[str] | None = None) -> int:
    try:
        return dispatch(sys.argv[1:] if argv is None else argv)
    except SuperviseError as e:
        print(f"supervise: {e}", file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
