"""The supervisor's daemon: detached from the SSH session, it runs launch.sh as the leader of its own process
group, records its state, watches the log for the ready line, and restarts the engine per policy.
Stdlib only, Python >= 3.8 (runs on the target).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import time
import traceback
from typing import Any

from .base import (
    EXIT_FAILED, KILL_WAIT, HEARTBEAT_EVERY, LogScanner, SCAN_BEFORE_READY, SCAN_EVERY, STATE, STOP_REQUEST, TICK, backoff_delay,
    UnsafePath, decode_wait_status, drain_s, group_alive, group_pids, kill_group, note, open_dir, should_restart,
    signal_name, wait_until, write_json,
)
from .group import GroupWatch
from .hang import HangWatch
from .replicas import ReplicaWatch
from .stacks import dump_stacks
from .lease import record_event, restart_refusal, take_fence
from .probe import NO_TOKEN, TokenWatch, Verdict
from .protocol import ROTATION_MARK

SHM = "/dev/shm"
# A stop announced ahead of its signal (a node group's replace writes every rank's stop request before it stops
# any: box/process.announce_stop) covers an engine that ends by itself this long after it was written: a rank
# whose peer went first ended with its group, not by a crash of its version. Bounded, so a request left by a
# client killed in between never hides a real crash for long.
STOP_AHEAD_S = 60.0
SHM_LOOK_EVERY = 5.0   # seconds between looks at what the engine's processes hold open in /dev/shm
SHM_KEPT = 4096        # entries remembered at most


class ShmLedger:
    """What the engine's process group holds in /dev/shm, so that what it leaves behind is removed once the group
    is gone (shared memory segments of a worker killed by the OOM killer, files an engine leaves on every run:
    docs/real-engines.md).

    Only files seen open or mapped by a process of the group are candidates, and one is removed only if it is
    still the same inode (device, inode), a regular file, owned by this user: never another user's or another
    deployment's file, never through a symlink (unlink does not follow one)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, int]] = {}
        self.next_look = 0.0

    def look(self, pgid: Any, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self.next_look or not isinstance(pgid, int) or pgid <= 1:
            return
        self.next_look = now + SHM_LOOK_EVERY
        for pid in group_pids(pgid):
            for name in _shm_names(pid):
                if name not in self.seen and len(self.seen) < SHM_KEPT:
                    ident = _own_file(name)
                    if ident is not None:
                        self.seen[name] = ident

    def look_now(self, pgid: Any) -> None:
        """Look at once (the group is about to end), whenever the last look was."""
        self.next_look = 0.0
        self.look(pgid)

    def clean(self) -> list[str]:
        """Remove what the (ended) group left; the names removed."""
        removed = []
        for name, ident in sorted(self.seen.items()):
            if _own_file(name) == ident:
                try:
                    os.unlink(os.path.join(SHM, name))
                    removed.append(name)
                except OSError:
                    pass
        self.seen.clear()
        return removed


def _shm_names(pid: int) -> set[str]:
    """Names directly in /dev/shm that `pid` has open (fds) or mapped (shared memory segments)."""
    names: set[str] = set()
    prefix = SHM + "/"
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                at = line.find(b" " + prefix.encode())
                if at >= 0:
                    names.add(line[at + 1:].rstrip(b"\n").decode("utf-8", "replace").replace(" (deleted)", ""))
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                names.add(target)
    except OSError:
        pass
    return {n[len(prefix):] for n in names if n.startswith(prefix) and "/" not in n[len(prefix):]}


def _own_file(name: str) -> tuple[int, int] | None:
    """(device, inode) of /dev/shm/`name` when it is a regular file of this user, else None."""
    try:
        st = os.lstat(os.path.join(SHM, name))
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return None
    return st.st_dev, st.st_ino


ROTATE_LOOK_EVERY = 2.0   # seconds between looks at engine.log's size
COPY_CHUNK = 8 << 20




class LogRotation:
    """engine.log kept bounded (an engine that logs every request fills the disk): once it is bigger than
    `max_bytes`, everything after its first `head_bytes` (cut at a line end: the engine's startup lines, the ones
    a diagnosis of the first start needs) moves to engine.log.1 (older tails to .2 .. .keep, the oldest dropped),
    and engine.log is cut back to that head plus one marker line. The engine keeps writing with O_APPEND, so its
    next line lands after the marker; what it writes between the last copy and the cut (microseconds) is lost.

    Nothing here follows a symlink: the log is opened O_NOFOLLOW, a tail is written to a new file (O_EXCL) and
    renamed over the old name."""

    def __init__(self, path: str, cfg: dict[str, Any], head_end: int | None = None) -> None:
        self.path = path
        self.max_bytes, self.head_bytes, self.keep = int(cfg["max_bytes"]), int(cfg["head_bytes"]), int(cfg["keep"])
        self.head_end = head_end   # where the kept startup part ends (fixed at the first rotation)
        self.next_look = 0.0

    def due(self, now: float) -> bool:
        if now < self.next_look:
            return False
        self.next_look = now + ROTATE_LOOK_EVERY
        try:
            return os.lstat(self.path).st_size > self.max_bytes
        except OSError:
            return False

    def rotate(self) -> tuple[int, int] | None:
        """(bytes moved out, offset where the engine's next line will land), or None when it could not."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW)  # reads seek; writes append
        except OSError as e:
            note(f"cannot rotate {self.path}: {e.strerror}")
            return None
        try:
            cut = self.head_end if self.head_end is not None else _line_end_before(fd, self.head_bytes)
            self._shift_tails()
            moved = self._move_tail(fd, cut)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            marker = (f"\n{ROTATION_MARK}{stamp}: {moved} bytes after the startup "
                      f"part moved to {os.path.basename(self.path)}.1 ====\n").encode()
            os.ftruncate(fd, cut)
            os.write(fd, marker)   # appended, as the engine's own writes are: at the cut, before its next line
            self.head_end = cut
            return moved, cut + len(marker)
        except OSError as e:
            note(f"cannot rotate {self.path}: {e.strerror}")
            return None
        finally:
            os.close(fd)

    def _shift_tails(self) -> None:
        for n in range(self.keep, 0, -1):
            older = f"{self.path}.{n}"
            if not os.path.lexists(older):
                continue
            if n == self.keep:
                os.unlink(older)
            else:
                os.replace(older, f"{self.path}.{n + 1}")

    def _move_tail(self, fd: int, cut: int) -> int:
        """Copies log[cut:] (to its end, as it grows) into a new engine.log.1; the bytes copied."""
        tmp = f"{self.path}.1.tmp.{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
        pos = cut
        try:
            for _ in range(1 << 16):  # bounded: the engine cannot outrun a local copy for ever
                os.lseek(fd, pos, os.SEEK_SET)
                chunk = os.read(fd, COPY_CHUNK)
                if not chunk:
                    break
                os.write(out, chunk)
                pos += len(chunk)
        finally:
            os.close(out)
        os.replace(tmp, f"{self.path}.1")
        return pos - cut


def _line_end_before(fd: int, limit: int) -> int:
    """The offset just after the last newline in the first `limit` bytes (`limit` itself if there is none)."""
    os.lseek(fd, 0, os.SEEK_SET)
    head = os.read(fd, limit) if limit > 0 else b""
    at = head.rfind(b"\n")
    return at + 1 if at >= 0 else len(head)


class Daemon:
    """The detached supervisor: runs the engine, records its state, restarts it per policy."""

    def __init__(self, run_dir: str, cfg: dict[str, Any], env: dict[str, str], report_fd: int,
                 claim_fd: int | None = None) -> None:
        self.run_dir, self.cfg, self.env = run_dir, cfg, env
        self.claim_fd = claim_fd  # the host-wide port claim: handed to every engine it starts
        self.report_fd: int | None = report_fd
        self.log = cfg["log"]  # relative: the daemon's cwd is the run dir, opened and checked once (_daemon_main)
        self.engine_pid: int | None = None
        self.exit_status: int | None = None
        self.stop_requested = False
        self.restart_times: list[float] = []
        self.scanner = LogScanner(self.log, None, 0)
        self.next_scan = self.next_group = 0.0
        self.next_beat = 0.0  # the heartbeat: state.json rewritten at least every HEARTBEAT_EVERY s (deploy status)
        self.group = GroupWatch.from_config(cfg.get("group"))  # one engine across nodes: watch the peers
        self.peer_lost: str | None = None
        self.shm = ShmLedger()
        self.stuck = False  # this run printed a fatal line and was ended for it
        self.rotation = LogRotation(self.log, cfg["logs"]) if isinstance(cfg.get("logs"), dict) else None
        self.fence = take_fence()  # the lease tokens it was started under: a restart needs no one else's lock
        # the one-token probe after ready (probe); an older supervise.json has none
        self.probe = TokenWatch(cfg["probe"], env) if isinstance(cfg.get("probe"), dict) else None
        self.probe_dead: dict[str, Any] | None = None  # this run was ended by the probe: why
        # the hang rule (hang): requests held and no engine step for health.hang_s
        hang = HangWatch(cfg["probe"], self.probe.once if self.probe is not None and self.probe.model else None) \
            if isinstance(cfg.get("probe"), dict) else None
        self.hang = hang if hang is not None and hang.enabled else None
        self.hung: dict[str, Any] | None = None  # this run was ended as hung: the rule's record and its stacks
        # a fleet's router: the hang rule on each replica it routes to, a hung one pulled (replicas)
        self.deployment = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))  # <deployment>/runs/<id>
        watch = ReplicaWatch(cfg["replica_watch"], env, self.deployment) \
            if isinstance(cfg.get("replica_watch"), dict) else None
        self.replicas = watch if watch is not None and watch.enabled else None
        self.state: dict[str, Any] = {
            "status": "starting", "supervisor_pid": os.getpid(), "pid": None, "pgid": None,
            "started_at": None, "ready_at": None, "ended_at": None, "exit_code": None, "signal": None,
            "signal_name": None, "restarts": 0, "last_crash": None, "log_offset": 0,
            "traceback_offset": None, "peer_lost": None, "stable_at": None, "crashloop_after_ready": False,
            "rotated": 0, "log_head": None, "unhealthy": None, "heartbeat_at": None}

    def save(self) -> None:
        """state.json, atomically; every save is also a heartbeat (`heartbeat_at`: this daemon still runs)."""
        self.state["updated_at"] = self.state["heartbeat_at"] = time.time()
        self.next_beat = time.monotonic() + HEARTBEAT_EVERY
        try:
            write_json(STATE, self.state)
        except OSError as e:  # a full disk must not kill the supervisor: the next save that fits catches up
            note(f"cannot write {STATE}: {e.strerror}")

    def beat(self) -> None:
        """The heartbeat when due: a supervisor that stops beating (SIGSTOP, wedged) reads as frozen in status."""
        if time.monotonic() >= self.next_beat:
            self.save()

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
            elif self.state["status"] in ("running", "ready"):
                now = time.monotonic()
                if now >= self.next_scan:
                    self.check_ready()
                if now >= self.next_group:
                    self.next_group = now + SCAN_EVERY
                    self.check_group()
                    self.check_stable()
                self.check_probe(now)
                self.check_hang(now)
                self.check_replicas(now)
                self.shm.look(self.state["pgid"], now)
                if self.rotation is not None and self.rotation.due(now):
                    self.rotate_log()
            self.beat()
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
            _exec_engine(fd, bash, os.path.join(".", self.cfg["launch"]), env, self.claim_fd)
        os.close(fd)
        try:
            os.setpgid(pid, pid)  # also in the child: whichever runs first wins the race
        except OSError:
            pass
        self.engine_pid, self.exit_status, self.peer_lost, self.stuck = pid, None, None, False
        self.probe_dead = self.hung = None
        if self.probe is not None:
            self.probe.reset(time.monotonic())
        if self.hang is not None:
            self.hang.reset(time.monotonic())
        if self.group is not None:
            self.group.reset()
        self.scanner = LogScanner(self.log, self.cfg["ready_pattern"], offset, self.cfg.get("fatal_patterns"))
        note(f"engine started: pid {pid}, log offset {offset}")
        self.state.update(status="running", pid=pid, pgid=pid, started_at=time.time(), ready_at=None,
                          ended_at=None, exit_code=None, signal=None, signal_name=None, log_offset=offset,
                          traceback_offset=None, peer_lost=None, group_seen=[], unhealthy=None, hung=None)
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
        had_traceback = self.scanner.traceback_at
        if self.scanner.found() and self.state["status"] == "running":
            self.state.update(status="ready", ready_at=time.time())
            self.save()
        seen, grace = self.scanner.fatal_seen, float(self.cfg.get("fatal_grace_s", 5.0))
        if seen is not None and self.state["status"] == "running" and time.monotonic() - seen >= grace \
                and self.exit_status is None and not self.stuck:
            # e.g. a restart by the policy that meets its port taken: never ready, never exiting (a hang
            # at 3 a.m. that status would call "running" for ever); ended here, it is a failure with its log
            self.stuck = True
            note(f"engine printed a fatal error and did not exit within {grace:g} s: ending it")
            self.clear_group(self.state["pgid"])
        self.next_scan = time.monotonic() + (SCAN_EVERY if self.state["status"] == "ready" else SCAN_BEFORE_READY)
        if self.scanner.traceback_at != had_traceback:
            self.state["traceback_offset"] = self.scanner.traceback_at
            self.save()

    def check_stable(self) -> None:
        """Ready for restart.stable_s with no crash: this version stayed up (a good one for rollback)."""
        s = self.state
        ready_at = s.get("ready_at")
        if s["status"] != "ready" or s.get("stable_at") or not isinstance(ready_at, (int, float)):
            return
        if time.time() - ready_at >= float(self.cfg["restart"]["stable_s"]):
            s["stable_at"] = time.time()
            note(f"engine stable: ready for {self.cfg['restart']['stable_s']:g} s without a crash")
            self.save()

    def rotate_log(self) -> None:
        self.scanner.scan()  # whatever the engine wrote so far is looked at before it moves
        done = self.rotation.rotate() if self.rotation is not None else None
        if done is None:
            return
        moved, next_at = done
        head = self.rotation.head_end if self.rotation is not None else 0
        s = self.state
        s["rotated"] = int(s.get("rotated") or 0) + moved
        s["log_head"] = next_at
        if int(s.get("log_offset") or 0) > (head or 0):  # this engine's first line moved out
            s["log_offset"] = next_at
        if isinstance(s.get("traceback_offset"), int) and s["traceback_offset"] >= (head or 0):
            s["traceback_offset"] = None
        self.scanner.pos, self.scanner.carry = next_at, b""
        if self.scanner.traceback_at is not None and self.scanner.traceback_at >= (head or 0):
            self.scanner.traceback_at = None
        note(f"engine.log rotated: {moved} bytes moved to {os.path.basename(self.log)}.1")
        self.save()

    def check_group(self) -> None:
        """Once ready, a peer rank that is gone breaks the group: end this rank too, as a crash (restarted by the
        policy like the others), so no rank serves or waits alone."""
        if self.group is None or self.peer_lost or self.hung is not None or self.state["status"] != "ready":
            return
        lost = self.group.lost(self.state["pgid"])
        seen = sorted(self.group.seen)
        if seen != self.state.get("group_seen"):  # what `up` waits for before it calls the group ready
            self.state["group_seen"] = seen
            self.save()
        if lost:
            self.peer_lost = lost
            note(f"group broken: {lost}; stopping this rank")
            self.state["peer_lost"] = {"at": time.time(), "reason": lost}
            self.save()
            self.clear_group(self.state["pgid"])

    def check_probe(self, now: float) -> None:
        """Once ready, the one-token probe every probe interval: a failure under load marks the engine unhealthy;
        `failures` in a row while idle end it as a crash (the restart policy takes it from there)."""
        probe = self.probe
        if probe is None or self.state["status"] != "ready" or self.probe_dead is not None:
            return
        verdict = probe.result()
        if verdict is not None:
            self.judge_probe(probe, verdict)
        if self.probe_dead is None:
            probe.due(now)

    def judge_probe(self, probe: TokenWatch, verdict: Verdict) -> None:
        s = self.state
        if verdict.ok:
            if self.hang is not None:
                self.hang.alive(time.monotonic())  # a token came back: the engine steps
            if s.get("unhealthy"):
                note("one-token probe: a token again")
                s["unhealthy"] = None
                self.save()
            return
        running, waiting = verdict.load if verdict.load is not None else (None, None)
        since = (s.get("unhealthy") or {}).get("since") or time.time()
        s["unhealthy"] = {"since": since, "reason": verdict.reason, "running": running, "waiting": waiting,
                          "failures": probe.failures}
        if verdict.busy:
            note(f"one-token probe failed under load ({running:g} running, {waiting:g} waiting): unhealthy, "
                 f"not a crash: {verdict.reason}")
        elif probe.dead():
            self.probe_dead = {"at": time.time(), "reason": verdict.reason, "failures": probe.failures,
                               "health": verdict.health}
            note(f"{NO_TOKEN}: {probe.failures} one-token probes in a row failed while idle ({verdict.reason}; "
                 f"{verdict.health_said()}); ending it as a crash")
        elif not verdict.answering:
            note(f"one-token probe failed while idle and {verdict.health_said()} ({probe.failures} of "
                 f"{probe.limit}; an engine on its way down gets {probe.exit_grace_s:g} s to exit first): "
                 f"{verdict.reason}")
        else:
            note(f"one-token probe failed while idle ({probe.failures} of {probe.limit}): {verdict.reason}")
        self.save()
        if self.probe_dead is not None:
            self.clear_group(s["pgid"])

    def check_hang(self, now: float) -> None:
        """Once ready, the hang rule on every /metrics reading: hung -> the stacks of every process of the group
        into the run dir, then the group ended as a crash (the restart policy and its crash-loop rule apply)."""
        hang = self.hang
        if hang is None or self.state["status"] != "ready" or self.hung is not None or self.probe_dead is not None \
                or self.peer_lost:
            return
        record = hang.result()
        if record is None:
            hang.due(now)
            return
        self.group_view(record)
        pgid = self.state["pgid"]
        note(f"engine hung: {record['reason']}; taking the stacks of group {pgid}, then ending it as a crash")
        self.hung = record
        self.state["hung"] = record
        self.save()
        record["stacks"] = dump_stacks(pgid, f"hang-stacks-{self.state['restarts']}.txt", self.env)
        note(f"stacks of {len(record['stacks']['processes'])} processes ({record['stacks']['method']}) in "
             f"{record['stacks']['file']}")
        self.save()
        self.clear_group(pgid)

    def group_view(self, record: dict[str, Any]) -> None:
        """Node 0 of a group, hung: the followers that do not answer now are named in the record (a rank that
        stops progressing holds rank 0 in the group's collective); the restart is of the whole group as ever."""
        if self.group is None or self.group.role != "leader":
            return
        silent = self.group.silent()
        record["silent_ranks"] = silent
        said = ", ".join(silent) + (" does not answer its health check" if len(silent) == 1 else
                                    " do not answer their health checks")
        record["reason"] += "; " + (said if silent else "every other rank answers its health check")

    def check_replicas(self, now: float) -> None:
        """A fleet's router, once ready: what its watch of the replicas did (a pull, an add-back) into state.json
        (`pulled`) and the deployment's lock history (`deploy history`)."""
        watch = self.replicas
        if watch is None or self.state["status"] != "ready":
            return
        events, pulled = watch.result()
        if events:
            lock = os.path.join(self.deployment, "lock")
            for event in events:
                note(event["detail"])
                record_event(lock, dict(event, at=time.time(), what="replica watch"))
            self.state["pulled"] = pulled or None
            self.save()
        watch.due(now)

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
        self.shm.look_now(self.state["pgid"])  # its children may still run (and hold files) until cleared
        self.clear_group(self.state["pgid"])
        self.clean_shm()
        if stop_on_its_way():
            note("the engine ended while a stop of it was on its way (its node group is being stopped): stopped")
            self.stop()
            return False
        s, rs = self.state, self.cfg["restart"]
        s["last_crash"] = {"at": s["ended_at"], "exit_code": s["exit_code"], "signal": s["signal"],
                           "signal_name": s["signal_name"], "log_offset": s["log_offset"],
                           "traceback_offset": self.scanner.traceback_at, "peer_lost": self.peer_lost,
                           "probe_dead": self.probe_dead, "hung": self.hung}
        # nobody asked it to stop (a stop request takes the other path): a crash, whatever its exit code
        if not (was_ready and should_restart(rs["policy"])):
            return self.finish("exited")
        now = time.time()
        recent = [t for t in self.restart_times if now - t < rs["window_s"]]
        if len(recent) >= rs["max"]:
            s["crashloop_after_ready"] = True  # this version does not stay up: not one to go back to
            return self.finish("crashloop")
        s["status"] = "restarting"
        self.save()
        delay = backoff_delay(rs["backoff_s"], len(recent))
        note(f"restarting in {delay:g} s ({len(recent)} restarts in the last {rs['window_s']:g} s)")
        if not self.sleep(delay):
            return self.finish("stopped")
        refused = restart_refusal(self.run_dir, self.fence) or self.moved()
        if refused:
            note(refused)
            return self.finish("exited")
        self.restart_times = recent + [time.time()]
        s["restarts"] += 1
        self.spawn()
        return True

    def moved(self) -> str | None:
        """Why the run dir's path no longer leads, safely, to the directory this daemon runs in (its cwd): then
        nothing is restarted (what runs is always the cwd's launch.sh; this only makes the end honest)."""
        try:
            fd = open_dir(self.run_dir, self.run_dir)
        except (OSError, UnsafePath) as e:
            return f"not restarted: {e}"
        try:
            now, here = os.fstat(fd), os.stat(".")
        finally:
            os.close(fd)
        if (now.st_dev, now.st_ino) != (here.st_dev, here.st_ino):
            return f"not restarted: {self.run_dir} now leads to another directory than the one this run started in"
        return None

    def sleep(self, seconds: float) -> bool:
        """Backoff wait that reaps and gives way to a stop request (then False)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stop_requested:
                return False
            self.reap()
            self.beat()
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
        grace, why = float(self.cfg["grace_s"]), None
        try:
            with open(STOP_REQUEST, encoding="utf-8") as f:
                asked = json.load(f)
            why = asked.get("why") if isinstance(asked.get("why"), str) else None
            grace = float(asked["grace_s"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        self.state["status"] = "stopping"
        self.state.pop("stopped_for", None)
        if why:  # a stop for a replace says so from its first moment: status never reads it as a `down` (8)
            self.state["stopped_for"] = why
        self.save()
        grace += drain_s(self.cfg)  # the engine finishes what is in flight first (restart.drain_s)
        pgid = self.state["pgid"]
        note(f"stop requested: SIGTERM to the engine (pid {self.engine_pid}), then to group {pgid}, "
             f"SIGKILL after {grace:g} s")
        self.shm.look_now(pgid)
        if self.engine_pid is not None:
            self.stop_engine(pgid, grace)
            self.record_end(self.exit_status)
        else:
            self.clear_group(pgid)
        self.clean_shm()
        self.finish("stopped")

    def stop_engine(self, pgid: Any, grace: float) -> None:
        """SIGTERM to the engine's main process first, as a container runtime does: it stops its own children.
        An engine given SIGTERM as a group can see a child die first, take that for a crash and SIGKILL itself
        (measured on a real engine: docs/real-engines.md); its main process alone shuts down cleanly.
        What is left of the group once the main process ended gets SIGTERM; whatever remains at the end of the
        grace, SIGKILL."""
        deadline = time.monotonic() + grace
        try:
            os.kill(self.engine_pid, signal.SIGTERM)  # type: ignore[arg-type]
        except (ProcessLookupError, PermissionError, TypeError):
            pass

        def leader_gone() -> bool:
            self.reap()
            return self.engine_pid is None or self.exit_status is not None
        if wait_until(leader_gone, grace) and group_alive(pgid):
            kill_group(pgid, signal.SIGTERM)
            self.wait_group(pgid, max(deadline - time.monotonic(), 0.0))
        if not self.wait_group(pgid, 0.0):
            kill_group(pgid, signal.SIGKILL)
            self.wait_group(pgid, KILL_WAIT)

    def clean_shm(self) -> None:
        removed = self.shm.clean()
        if removed:
            note(f"removed what the engine left in {SHM}: {', '.join(removed[:20])}"
                 + (f" (+{len(removed) - 20} more)" if len(removed) > 20 else ""))

    def finish(self, status: str) -> bool:
        note(f"supervisor done: {status}")
        self.state["status"] = status
        self.save()
        try:
            os.unlink(STOP_REQUEST)
        except OSError:
            pass
        return False


def stop_on_its_way() -> bool:
    """A stop request is in the run dir (the cwd), a plain file written within STOP_AHEAD_S."""
    try:
        st = os.lstat(STOP_REQUEST)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime < STOP_AHEAD_S


def _exec_engine(log_fd: int, bash: str, launch: str, env: dict[str, str], claim_fd: int | None) -> None:
    """In the forked child: own process group, default signals, stdio to the log, exec bash launch.sh.

    The port claim goes down to the engine, so the port stays claimed while it lives, even if we are killed."""
    try:
        os.setpgid(0, 0)
        if claim_fd is not None:
            os.set_inheritable(claim_fd, True)
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


def _daemon_main(run_dir: str, cfg: dict[str, Any], env: dict[str, str], keep: list[int],
                 claim_fd: int | None = None, run_fd: int | None = None) -> None:
    """The daemon's life. `run_fd`: the run dir as the caller opened and checked it (base.open_dir); it
    becomes the cwd, and every file of the run is reached relative to it from then on, never by its path again."""
    code, report_fd = EXIT_FAILED, keep[0]
    daemon = None
    try:
        _close_fds_except(keep + [fd for fd in (claim_fd, run_fd) if fd is not None])
        if run_fd is not None:
            os.fchdir(run_fd)
            os.close(run_fd)
        else:
            os.chdir(run_dir)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        out = os.open("supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
        os.dup2(out, 1)
        os.dup2(out, 2)
        daemon = Daemon(run_dir, cfg, env, report_fd, claim_fd)
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
