"""Shared parts of the target-side supervisor: constants, the env file, supervise.json, state.json, liveness
of processes and groups, the incremental log scanner, and the safety rules for what deployer creates on the
target (directories no other user controls, files opened without following symlinks). Stdlib only, Python >= 3.8
(runs on the target).
"""

from __future__ import annotations

import errno
import fcntl
import grp
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from typing import Any, Callable, List

# The record formats and run statuses (one definition, shared with deployer): protocol.
from .protocol import (  # re-exported: the statuses' old home
    CRASHED as CRASHED, ENDED as ENDED, LIVE as LIVE, POLICIES as POLICIES, RUN_LOCK as RUN_LOCK, UP as UP,
)
from .protocol import (
    ENGINE_LOG, ENV_FILE, LAUNCH_SH, STATE_JSON, STOP_REQUEST_JSON, SUPERVISE_JSON,
)

STATE, STOP_REQUEST = STATE_JSON, STOP_REQUEST_JSON
TICK, SCAN_EVERY, START_TIMEOUT, KILL_WAIT = 0.05, 0.5, 10.0, 5.0
# Until the ready line is seen the log is scanned more often: `up` calls the engine ready when /health answers,
# and a `deploy status` right after it should read "ready" too, not "running" for up to SCAN_EVERY.
SCAN_BEFORE_READY = 0.1
# How every python of the payload is started on the target (the helper, the supervisor, the guard, the boot-time
# start): -B writes no bytecode into run dirs; -S skips `site`: the payload is stdlib only, so nothing of
# site-packages is needed, and a .pth file there runs its code at every start (one that imports certifi: ~30 ms of
# each of the many short pythons a deployment starts) and would run inside deployer's supervisor.
PYTHON_FLAGS = ("-B", "-S")
# The daemon rewrites state.json's `heartbeat_at` at least every HEARTBEAT_EVERY s; a live supervisor whose heartbeat
# is older than HEARTBEAT_STALE (ten beats: a loaded box's stall is not a freeze) is "frozen" (SIGSTOPped, wedged).
HEARTBEAT_EVERY, HEARTBEAT_STALE = 2.0, 20.0
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUSY, EXIT_UNSAFE = 1, 2, 75, 77
# ready_pattern: deployer always writes the engine's own ready line (every release has); none is assumed here.
DEFAULTS: dict[str, Any] = {"launch": LAUNCH_SH, "env_file": ENV_FILE, "log": ENGINE_LOG, "grace_s": 30,
                            "ready_pattern": None}
DEFAULT_RESTART: dict[str, Any] = {"policy": "no", "max": 5, "backoff_s": [10, 300], "window_s": 600,
                                   "stable_s": 60}
DEFAULT_LOGS: dict[str, Any] = {"max_bytes": 256 << 20, "head_bytes": 1 << 20, "keep": 2}
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
        with open(os.path.join(run_dir, SUPERVISE_JSON), encoding="utf-8") as f:
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
    port = cfg.get("port")
    _need(port is None or (isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536),
          "port must be a TCP port number or null")
    fatal = cfg.setdefault("fatal_patterns", [])
    _need(isinstance(fatal, list) and all(isinstance(p, str) and p and _compiles(p) for p in fatal),
          "fatal_patterns must be a list of regular expressions")
    _need(_number(cfg.setdefault("fatal_grace_s", 5.0)) and cfg["fatal_grace_s"] >= 0,
          "fatal_grace_s must be a number >= 0")
    _need(rs["policy"] in POLICIES, f"restart.policy must be one of {', '.join(POLICIES)}")
    _need(isinstance(rs["max"], int) and not isinstance(rs["max"], bool) and rs["max"] >= 0,
          "restart.max must be an integer >= 0")
    b = rs["backoff_s"]
    _need(isinstance(b, list) and len(b) == 2 and all(_number(x) and x >= 0 for x in b),
          "restart.backoff_s must be [initial, maximum] seconds")
    _need(_number(rs["window_s"]) and rs["window_s"] > 0, "restart.window_s must be a number > 0")
    _need(_number(rs["stable_s"]) and rs["stable_s"] > 0, "restart.stable_s must be a number > 0")
    _need(_number(rs.get("drain_s", 0)) and rs.get("drain_s", 0) >= 0, "restart.drain_s must be a number >= 0")
    _need(isinstance(cfg.setdefault("on_boot", False), bool), "on_boot must be true or false")
    _need(isinstance(cfg.get("logs", {}), dict), "logs must be an object")
    cfg["logs"] = logs = dict(DEFAULT_LOGS, **cfg.get("logs", {}))
    for key in ("max_bytes", "head_bytes", "keep"):
        _need(isinstance(logs[key], int) and not isinstance(logs[key], bool) and logs[key] >= (key == "keep"),
              f"logs.{key} must be an integer >= {int(key == 'keep')}")
    _need(logs["head_bytes"] < logs["max_bytes"], "logs.head_bytes must be below logs.max_bytes")
    return cfg


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
        return True
    except re.error:
        return False


def drain_s(cfg: dict[str, Any]) -> float:
    """restart.drain_s: how long a stop lets the engine finish the requests in flight after SIGTERM, before the
    grace to SIGKILL starts (0 in a supervise.json that does not say)."""
    value = (cfg.get("restart") or {}).get("drain_s", 0)
    return float(value) if _number(value) and value > 0 else 0.0


def backoff_delay(backoff_s: list[float], recent_restarts: int) -> float:
    """Exponential backoff: initial * 2**n, capped at the maximum."""
    first, cap = backoff_s
    return float(min(first * (2 ** min(recent_restarts, 60)), cap))


def should_restart(policy: str) -> bool:
    """Whether the policy restarts an engine that ended after it was ready without being asked to stop.

    A server that ends on its own has failed, whatever its exit code: a real engine's API server was seen to
    exit 0 about 5 s after its worker was SIGKILLed, as the OOM killer does (docs/real-engines.md). So
    "on-failure" and "always" both restart every such end; "no" none."""
    return policy in ("always", "on-failure")


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
    """Atomic write: temp file, fsync, rename. On failure (a full disk) the temp file goes and `path` is as it was.
    The temp file is new (O_EXCL) and never a symlink's target; the rename replaces a link, never follows it."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        try:
            os.unlink(tmp)  # a stale one of a dead process with our pid
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


def supervision(state: dict[str, Any], now: float) -> str | None:
    """What watches a run that should have a supervisor (status starting/running/ready/restarting, or lost): "ok",
    "dead" (its pid is gone) or "frozen" (alive, but its heartbeat is older than HEARTBEAT_STALE); None for a run
    that ended or is stopping (nothing to watch), or a state without `supervisor_alive` (not yet judged)."""
    if state.get("status") == "lost":
        return "dead"
    if state.get("status") not in UP or "supervisor_alive" not in state:
        return None
    if not state["supervisor_alive"]:
        return "dead"
    beat = state.get("heartbeat_at")
    if isinstance(beat, (int, float)) and not isinstance(beat, bool) and now - beat > HEARTBEAT_STALE:
        return "frozen"
    return "ok"


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
    return bool(group_pids(pgid))


def group_pids(pgid: int) -> List[int]:
    """The live (non-zombie) processes of process group `pgid`, from /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    pids = []
    for name in names:
        st = _proc_stat(int(name)) if name.isdigit() else None
        if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
            pids.append(int(name))
    return pids


def kill_group(pgid: Any, sig: int) -> None:
    if isinstance(pgid, int) and pgid > 1:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


KILL_WAIT_S = 2.0  # after a child's process group was killed: how long its pipes may take to close


def communicate_bounded(proc: "subprocess.Popen[bytes]", stdin: "bytes | None",
                        timeout: float) -> "tuple[bytes, bytes, bool]":
    """`proc.communicate(stdin)` bounded by `timeout`: past it the child's process group (it was started in a
    session of its own) is killed and what it printed so far kept. (stdout, stderr (b"" when merged), timed out)."""
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        return out or b"", err or b"", False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            out, err = proc.communicate(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # a daemon that left the group still holds the pipes
            proc.kill()
            out, err = b"", b""
        return out or b"", err or b"", True


def note(message: str) -> None:
    """One timestamped line in supervisor.log (the daemon's stdout); lost, not fatal, on a full disk."""
    try:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)
    except OSError:
        pass


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

    FATAL_LINE = 8 << 10  # bytes of a fatal line kept across reads

    def __init__(self, path: str, pattern: str | None, offset: int, fatal: List[str] | None = None) -> None:
        self.path, self.pos, self.carry = path, offset, b""
        self.needle = pattern.encode() if pattern else None
        self.ready = False
        self.traceback_at: int | None = None
        # lines after which a server never becomes ready though it may not exit (engines/common/fatal.yaml)
        self.fatal = [re.compile(p.encode()) for p in fatal or []]
        self.fatal_seen: float | None = None   # time.monotonic() when the first one was read

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
        if self.fatal_seen is None and any(p.search(data) for p in self.fatal):
            self.fatal_seen = time.monotonic()
        keep = max(len(self.needle or b""), len(self.TRACEBACK), self.FATAL_LINE if self.fatal else 0) - 1
        self.carry = data[-keep:]

    def found(self) -> bool:
        self.scan()
        return self.ready


# -- what deployer creates on the target: nothing another user controls --------------------------------------------

class UnsafePath(SuperviseError):
    """A directory or file deployer would use that another user controls (or a symlink where a file must be):
    refused before anything is written there; the message is one line naming the path and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNSAFE)



def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int) -> bool:
    """Group write is harmless when the group is the user's own (named after it, nobody else in it)."""
    try:
        me, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getegid() and group.gr_name == me and set(group.gr_mem) <= {me}


def _others_write(st: os.stat_result) -> str | None:
    """Who besides the owner can write a directory: 'everyone', 'group NAME', or None."""
    if st.st_mode & stat.S_IWOTH:
        return "everyone"
    if st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid):
        try:
            name = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            name = str(st.st_gid)
        return f"group {name}"
    return None


def dir_problem(path: str, st: os.stat_result, own: bool) -> str | None:
    """Why `path` (stat `st`) is unsafe for deployer, or None. `own`: a directory deployer keeps its files in (the
    deployment dir and below: ours, writable by nobody else); else an ancestor (ours or root's, and writable by
    others only with the sticky bit, as /tmp is)."""
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != me and (own or st.st_uid != 0):
        return f"{path} is owned by {_user(st.st_uid)}, not {_user(me)}: another user controls it"
    others = _others_write(st)
    if others and own:
        return f"{path} is writable by {others}: another user could plant files in it"
    if others and not st.st_mode & stat.S_ISVTX:
        return f"{path} is writable by {others} without the sticky bit: another user could replace what is in it"
    return None


def _prefixes(path: str) -> List[str]:
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


O_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_PATH", 0) | getattr(os, "O_CLOEXEC", 0)
MAX_LINKS = 40


class _Walk:
    """One walk down a path from /, a directory fd at a time (openat with O_NOFOLLOW): nothing is resolved by
    the kernel behind our back, so what is checked is what is opened. A symlink is followed only above
    `owned_from`, and only when root or we own it (its directory, already checked, lets no one else replace it);
    at or below `owned_from` a symlink is refused, whoever made it."""

    def __init__(self, owned_from: str) -> None:
        self.owned_from, self.me, self.links = owned_from, os.geteuid(), 0

    def root(self) -> int:
        fd = os.open("/", O_DIR_NOFOLLOW)
        self._judge(fd, "/", _within("/", self.owned_from))
        return fd

    def _judge(self, fd: int, shown: str, own: bool) -> None:
        problem = dir_problem(shown, os.fstat(fd), own)
        if problem:
            os.close(fd)
            raise UnsafePath(problem)

    def step(self, fd: int, name: str, shown: str, own: bool) -> int | None:
        """The directory `name` in the directory `fd` (closed), opened and checked; None when it does not exist."""
        try:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError as e:
                raise UnsafePath(f"cannot inspect {shown}: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                return self._follow(fd, name, shown, st, own)
            try:
                nfd = os.open(name, O_DIR_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise UnsafePath(f"{shown} is not a directory") from None
                raise UnsafePath(f"cannot open {shown}: {e.strerror}") from None
        finally:
            os.close(fd)
        fst = os.fstat(nfd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            os.close(nfd)
            raise UnsafePath(f"{shown} was replaced while it was checked: refused")
        self._judge(nfd, shown, own)
        return nfd

    def _follow(self, fd: int, name: str, shown: str, st: os.stat_result, own: bool) -> int:
        """A symlink at `shown` (in directory `fd`, left open for the caller to close): the directory it leads
        to, walked the same way, or UnsafePath."""
        owner = _user(st.st_uid)
        if own:
            raise UnsafePath(f"{shown} is a symbolic link (owned by {owner}): refused (deployer never acts "
                             f"through one at or below {self.owned_from})")
        if st.st_uid not in (0, self.me):
            trusted = "root" if self.me == 0 else f"{_user(self.me)} or root"
            raise UnsafePath(f"{shown} is a symbolic link owned by {owner}, not {trusted}: another user controls "
                             f"where it leads")
        self.links += 1
        if self.links > MAX_LINKS:
            raise UnsafePath(f"{shown}: too many levels of symbolic links")
        target = os.readlink(name, dir_fd=fd)
        absolute = target.startswith("/")
        at = self.root() if absolute else os.open(".", O_DIR_NOFOLLOW, dir_fd=fd)
        where = "/" if absolute else os.path.dirname(shown)
        for part in [p for p in target.split("/") if p and p != "."]:
            where = os.path.normpath(os.path.join(where, part))
            nxt = self.step(at, part, where, False)
            if nxt is None:
                raise UnsafePath(f"{shown} is a symbolic link to {target}, which does not exist")
            at = nxt
        return at


def _walk(path: str, owned_from: str) -> "tuple[int | None, int]":
    """(an fd of `path` when it all exists, else None; how many leading components of it exist), every
    component checked on the way (dir_problem), never through a link another user controls."""
    walk = _Walk(owned_from)
    fd: int | None = walk.root()
    prefixes = _prefixes(path)
    exists = 1
    for prefix in prefixes[1:]:
        assert fd is not None
        fd = walk.step(fd, os.path.basename(prefix), prefix, _within(prefix, owned_from))
        if fd is None:
            return None, exists
        exists += 1
    return fd, exists


def check_dirs(path: str, owned_from: str) -> int:
    """Refuse (UnsafePath) a directory chain another user controls: every existing directory from / to `path`,
    walked a component at a time without the kernel following links (_Walk); those at or below `owned_from` must
    be ours alone and no symlink. Returns how many leading components exist (the rest are to be created)."""
    fd, exists = _walk(os.path.abspath(path), os.path.abspath(owned_from))
    if fd is not None:
        os.close(fd)
    return exists


def open_dir(path: str, owned_from: str) -> int:
    """A descriptor of the directory `path`, reached and checked as check_dirs does (O_PATH where the system has
    it: good for fchdir, fstat and dir_fd=, not for reading); UnsafePath, or FileNotFoundError when it is
    missing. What is run or read later through it cannot be re-pointed by a link."""
    path = os.path.abspath(path)
    fd, _ = _walk(path, os.path.abspath(owned_from))
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    return fd


def open_dir_to_read(path: str) -> int:
    """open_dir for reading what is there: every component of `path` judged as those above a deployment dir are
    (root's or ours, others' write only with the sticky bit, a symlink followed only when root or we own it), never
    resolved by the kernel; UnsafePath naming the component and its owner, FileNotFoundError when one is missing."""
    path = os.path.abspath(path)
    fd, _ = _walk(path, "\0")  # "\0" is no path: no component is held to a deployment dir's stricter rule
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    return fd


def make_dirs(path: str, owned_from: str, mode: int = 0o700) -> None:
    """`mkdir -p` that refuses a chain another user controls (check_dirs), before and after creating the missing
    directories (each new one `mode`, ours). OSError when one cannot be created."""
    path = os.path.abspath(path)
    exists = check_dirs(path, owned_from)
    for p in _prefixes(path)[exists:]:
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            pass  # made just now by a concurrent deployer of ours: checked below like the rest
    if exists < len(_prefixes(path)):
        check_dirs(path, owned_from)


def open_file(path: str, flags: int, mode: int = 0o644, what: str = "file") -> int:
    """os.open that never follows a symlink at `path` and refuses anything but a regular file of ours."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)  # NONBLOCK: a planted FIFO never hangs us
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"the {what} {path} is a symbolic link: refused (deployer never writes through one)") \
                from None
        raise
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = f"the {what} {path} is not a regular file: refused"
    elif st.st_uid != os.geteuid():
        problem = f"the {what} {path} is owned by {_user(st.st_uid)}, not {_user(os.geteuid())}: refused"
    if problem:
        os.close(fd)
        raise UnsafePath(problem)
    if not flags & os.O_NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def try_lock(path: str) -> "int | None":
    """An exclusive flock on the lock file `path` (made if missing, never through a symlink, ours), or None at once
    when another holds it (or it is not ours)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid != os.getuid():
            raise OSError(errno.EPERM, "not ours")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def remove_entry(path: str) -> None:
    """`path` gone, never followed: a symlink is unlinked, a directory removed without following links in it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # rmtree does not follow symlinks inside (it unlinks them)
    else:
        os.unlink(path)
