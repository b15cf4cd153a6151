#!/usr/bin/env python3
"""The target-side repair of an interrupted replace: a small guard that outlives a client killed with -9.

Stdlib only, Python >= 3.8. `up` (restart, rollback: the same attempts) arms it through its helper, from the new run
dir's own copy, right before it stops the version that serves:

  supervise_guard.py arm DEPLOYMENT_DIR --old RUN_DIR --grace S [--port P[,Q...]] [--new RUN_DIR]

A fleet's `up` (restart, rollback) that replaces its router (its settings changed) arms the same guard, from the new
router run dir's copy, with `--new` (that run dir, pushed completely before the guard is armed) and both of the
router's ports, right before it stops the old router.

A rolling restart arms one on the router's host, from that deployment's synced copy, before it drains a replica:

  supervise_guard.py arm-router ROUTER_DEPLOYMENT_DIR       (stdin: {"url", "address", "port", "api_key"?,
                                                            "router_key"?})

`arm` writes the intent (DEPLOYMENT_DIR/replace-intent.json: the run to bring back, the stop's grace, the engine
port, the guard's pid; router-intent.json: the replica's URL and the router's address and port, never the API key
(the replicas' key, given to the router with the worker) nor the router's control key (what opens its worker API),
which the guard keeps in memory), detaches the guard (its own session, output appended to DEPLOYMENT_DIR/repair.log) and
prints `{"guard_pid": N}`. The lease tokens the helper hands to what it runs (env DEPLOYER_LEASE_TOKENS) are the
client's: the guard keeps them in memory only (nothing secret on disk).

The guard then watches, every POLL_S, until one of these:
- the intent is gone (the client finished the replace, or brought back what it stopped, and removed it) and the
  guard sees for itself that the run `current` names is up under a live supervisor, or the client replaced it with
  `{"left_stopped": why}` (`--no-rollback`: it decided to leave it stopped): it leaves. A client that removed it
  while nothing runs (its bring-back failed: the port taken meanwhile; or was cut short by a second Ctrl-C) is not
  believed: the guard writes the intent back and goes on as if it had never been removed;
- the lock's lease is another's (broken with --break-lock, taken over, a `down`): it leaves and changes nothing
  (fencing: an operation that lost its lock acts no more);
- the lease was released (nobody holds it) with the intent still there (the client left without finishing: a
  second interrupt), or it is still the client's but the process on this host that held it (its helper, or lease
  program) is gone
  for REPAIR_WAIT_S (the client died: kill -9, or its connection dropped and it did not come back; a client that
  reconnects re-takes the lease from a new, live process and the guard goes on watching): it repairs. A released
  lease whose stopped run no longer holds the replace's ports while something else does (another user squatted
  the port in the replace window) waits, without the lock (on-call may `down` or `up` meanwhile), its holder logged
  (pid, command, user), until the port is free: then it repairs.

The repair takes the lease itself (mode `inherit`: only from the client's token, so whoever broke or took the lock
in between wins), which makes a client coming back late get the lost-lock error. Then: a replacement that runs
(`current` names a run that is alive) is left running (nothing half done); otherwise the stop of the old run is
finished, and, once its ports are free, `current` points at the run to start (box/switch.py's rules: right
before the start), which is started from its own run dir: the old run, or with `--new` (a router) the new one when
its run dir is complete, the old one again when the new one does not start or does not reach ready within
NEW_READY_S. Why the new router first: the client had already decided it (its settings are what the profile now
says; its worker list is the replicas that `up` found ready, while the old router's launch.sh names the workers it
was started with, which the worker API may have changed since), and a router holds no state a restart loses; the
old one, which served, is the fallback when the new settings do not start. A router's guard asks the router (its HTTP API on this host) to take the
replica back, after its drain, every few seconds until the router lists it (smg lists a worker once it answers its
health check) or READD_S passed. Lock events record the takeover and what the repair did (`deploy history`
shows both); the lease is released and the intent removed. The guard lives at most LIFE_S.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import stat
import subprocess
import sys
import time
from typing import Any, Callable

from .supervise import cmd_stop, status_of
from .base import (
    EXIT_BAD_INPUT, PYTHON_FLAGS, SuperviseError, UnsafePath, check_dirs, open_file, pid_alive, write_json,
)
from .lease import (
    FENCE_ENV, LeaseError, Refused, acquire, held, record_event, still_ours, take_fence, update,
)
from .ports import claimed_by, port_bindable, port_holders
from .protocol import ENV_FILE, INTENT, LAUNCH_SH, PROFILE_JSON, ROUTER_INTENT, SUPERVISE_JSON, UP
from .replicas import pending_job, read_lease_at, router_call, worker_answers

REPAIR_LOG = "repair.log"
REPAIR_WAIT_S = 3.0  # a dropped connection's reconnect window (the client re-takes its lease meanwhile)
POLL_S = 0.25
LIFE_S = 6 * 3600.0
PORT_WAIT_S = 30.0
START_S = 60.0
NEW_READY_S = 60.0   # a new router's start until its ready line (deployments/fleet/router.py READY_TIMEOUT_S)
RUN_FILES = (LAUNCH_SH, ENV_FILE, PROFILE_JSON, SUPERVISE_JSON, "supervise.py")  # a run dir a push completed
READD_S = 300.0      # how long the router's guard asks for the replica back (its own repair may be loading it)
READD_EVERY_S = 5.0
DRAIN_WAIT_S = 20.0  # a re-add while it still drains is "already exists", and the drain's end removes it
LOG_MAX = 256 << 10


def _log(message: str) -> None:
    print(time.strftime("%Y-%m-%d %H:%M:%S ") + message, flush=True)


def read_intent(path: str) -> dict[str, Any] | None:
    try:
        fd = open_file(path, os.O_RDONLY, 0, "intent")
    except (OSError, UnsafePath):
        return None
    try:
        data = json.loads(os.read(fd, 65536).decode("utf-8", "replace") or "null")
    except ValueError:
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _run_dir(deployment: str, path: str) -> str:
    """A run dir of this deployment (runs/<id>, no symlink on the way), else SuperviseError."""
    runs = os.path.join(deployment, "runs")
    real = os.path.abspath(path)
    if os.path.dirname(real) != runs or not os.path.isdir(real) or os.path.islink(real):
        raise SuperviseError(f"{path} is not a run dir of {deployment}", EXIT_BAD_INPUT)
    return real


def _current(deployment: str) -> str | None:
    try:
        link = os.readlink(os.path.join(deployment, "current"))
    except OSError:
        return None
    return os.path.join(deployment, "runs", os.path.basename(link.rstrip("/")))


def _set_current(deployment: str, run: str) -> None:
    """`current` -> runs/<id>, atomically (a new link renamed over the old one, never followed)."""
    path = os.path.join(deployment, "current")
    tmp = os.path.join(deployment, ".current.%s.link" % os.urandom(6).hex())
    os.symlink(os.path.join("runs", os.path.basename(run)), tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


def _wait_ports(ports: list[int]) -> int | None:
    """None once every port is free (bounded by PORT_WAIT_S), else the port that stayed busy."""
    deadline = time.monotonic() + PORT_WAIT_S
    for port in ports:
        while _busy(port):
            if time.monotonic() > deadline:
                return port
            time.sleep(0.5)
    return None


def _busy(port: int) -> bool:
    return claimed_by(port) is not None or not port_bindable(port)


def _held_by(port: int) -> str:
    """Who holds `port`: 'pid N (comm) of user U', or the claim's holder, as ports names them."""
    return ", ".join(port_holders(port)) or claimed_by(port) or "a process unknown"


def _complete(run: str) -> bool:
    """Every file a push writes is there, a regular file (a push that failed removes its run dir)."""
    for name in RUN_FILES:
        try:
            if not stat.S_ISREG(os.lstat(os.path.join(run, name)).st_mode):
                return False
        except OSError:
            return False
    return True


def _intent_ports(intent: dict[str, Any]) -> list[int]:
    return [p for p in intent.get("ports") or [] if isinstance(p, int) and 0 < p < 65536]


def _holder() -> dict[str, Any]:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return {"owner": "%s@%s" % (getpass.getuser(), socket.gethostname()), "pid": os.getpid(),
            "host_id": "%s/%s" % (socket.gethostname(), boot), "command": "repair of an interrupted replace"}


def _router_call(intent: dict[str, Any], secret: str, method: str, path: str, body: Any = None) -> Any:
    """One request to the router's API on this host; the JSON answer, None when it does not answer."""
    return router_call(str(intent["address"]), int(intent["port"]), secret, method, path, body)


def _router_workers(intent: dict[str, Any], secret: str) -> set[str] | None:
    data = _router_call(intent, secret, "GET", "/workers")
    if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
        return None
    return {str(w.get("url")) for w in data["workers"] if isinstance(w, dict)}


_worker_answers = worker_answers   # replicas: the router's watch of its replicas asks the same
_pending = pending_job


class LostLock(Exception):
    """The lease the repair took is no longer its own: it stops where it is."""


class Guard:
    """One armed guard: the deployment, the intent it watches, the client's lease tokens."""

    def __init__(self, deployment: str, tokens: frozenset[str], intent: str = INTENT) -> None:
        self.deployment = deployment
        self.intent = os.path.join(deployment, intent)
        self.lock = os.path.join(deployment, "lock")
        self.tokens = tokens
        self.secret = ""  # the replicas' API key (kept in memory only: never in the intent)
        self.router_key = ""  # the router's control key, for its worker API (the same: memory only)
        self._held: tuple[int, str] = (-1, "")  # the lease the repair took: (open lock fd, its token)

    def watch(self, clock: Callable[[], float] = time.monotonic) -> str:
        """Wait for the client to finish or to be gone; what happened, in a few words. A replace's guard disarms
        only once it saw for itself that what should serve runs (`current`'s run up under a live supervisor), or
        the client said it leaves it stopped (`--no-rollback`): a client that removed the intent while nothing
        runs (its bring-back failed, or was cut short) is not believed, and the guard stays armed with the
        intent it was armed with."""
        end, gone_since, armed, kept, waited = clock() + LIFE_S, None, None, False, ""
        while clock() < end:
            intent = armed if kept else read_intent(self.intent)
            if not kept and (intent is None or intent.get("guard_pid") != os.getpid()):
                left = self._disarmed(intent)
                if left or armed is None:
                    return left or "disarmed: the client finished the replace"
                kept, intent = True, armed
                _log("the client disarmed the guard, but nothing serves: still armed")
                try:
                    write_json(self.intent, armed)  # the intent on disk says again that a guard is armed
                except OSError:
                    pass  # a full disk: the guard keeps it in memory
            assert intent is not None
            armed = intent
            lease = read_lease_at(self.lock)
            mine = lease.get("token") in self.tokens
            if not mine and (held(lease, time.time()) or intent.get("url") or lease.get("token")):
                return "left: the lock is no longer the client's (broken or taken over)"
            if mine:  # the client's lease: repaired once the process that holds it is gone REPAIR_WAIT_S
                gone_since = None if pid_alive(lease.get("holder_pid")) else \
                    clock() if gone_since is None else gone_since
            if not mine or (gone_since is not None and clock() - gone_since >= REPAIR_WAIT_S):
                serving = self._serving() if kept else ""
                if serving:
                    return "disarmed: " + serving
                busy = "" if mine else self._foreign_port(intent)
                if not busy:  # released, the replace not finished (nobody else will), or the client is gone
                    return self.repair(intent, str(lease["token"]) if mine else "")
                if busy != waited:
                    _log("not repaired yet: %s; starts once it is free" % busy)
                    waited = busy
            time.sleep(POLL_S)
        return "left: the client did not finish within the guard's life"

    def _disarmed(self, now: dict[str, Any] | None) -> str:
        """Why the guard may leave now that the intent it wrote is gone (or replaced); "" when it may not."""
        if self.intent.endswith(ROUTER_INTENT):
            return "disarmed: the client finished the rolling restart"
        if now is not None and now.get("left_stopped"):
            return "disarmed: left stopped, as the client decided (%s)" % str(now["left_stopped"])[:200]
        if now is not None and now.get("guard_pid"):
            return "left: guard %s is armed for a later replace" % now.get("guard_pid")
        serving = self._serving()
        return "disarmed: " + serving if serving else ""

    def _serving(self) -> str:
        """'<run> is <status> (checked by the guard)' when `current`'s run is up under a live supervisor, else ""."""
        run = _current(self.deployment)
        now = status_of(run) if run is not None and os.path.isdir(run) else {}
        if now.get("status") in UP and now.get("supervisor_alive"):
            return "%s is %s under its supervisor (checked by the guard)" % (os.path.basename(str(run)),
                                                                             now.get("status"))
        return ""

    @staticmethod
    def _foreign_port(intent: dict[str, Any]) -> str:
        """'port P is held by ...' when a port of the replace is taken by something other than the stopped run
        (another user squatted it in the replace window): the repair waits for it, without the lock, so on-call
        can still `down` or `up` meanwhile; "" when the ports are free or the old run still holds them."""
        old = intent.get("old_run")
        then = status_of(str(old)) if old else {}
        if then.get("alive") or then.get("supervisor_alive"):
            return ""  # its own stop frees them (the repair finishes it first)
        for port in _intent_ports(intent):
            if _busy(port):
                return "port %d is held by %s" % (port, _held_by(port))
        return ""

    def repair(self, intent: dict[str, Any], client_token: str) -> str:
        """Take the lock (from the gone client's lease, or, `client_token` "", a lease nobody holds) and finish the
        replace."""
        token = os.urandom(16).hex()
        one = float(intent.get("grace_s") or 0) + PORT_WAIT_S + START_S  # a stop, the port wait, a start
        lease_s = (READD_S if intent.get("url") else one + (one + NEW_READY_S if intent.get("new_run") else 0)) + 30
        try:
            fd, _ = acquire(self.lock, _holder(), token, lease_s, "inherit" if client_token else "take", client_token)
        except Refused as r:
            return "left: the lock was %s before the repair could take it" % r.verdict
        except LeaseError as e:
            return "left: cannot take the lock: %s" % e
        try:
            self._held = (fd, token)
            try:
                done = self._add_back(intent) if intent.get("url") else self._bring_back(intent, token)
            except LostLock as lost:
                return str(lost)
            record_event(self.lock, {"at": time.time(), "event": "repaired", "detail": done,
                                     "what": "rolling restart" if intent.get("url") else "replace",
                                     "by": {k: v for k, v in _holder().items()}})
            try:
                os.unlink(self.intent)
            except OSError:
                pass
            return "repaired: " + done
        finally:
            try:
                update(fd, token, lease_s, release=True)
            except LeaseError:
                pass
            os.close(fd)

    def _still_ours(self) -> None:
        """Fencing for the guard itself: LostLock once someone broke or took over the lease it took."""
        ours, lease = still_ours(*self._held)
        if not ours:
            raise LostLock("stopped: the lock was taken by %s pid %s (%s)" % (lease.get("owner"), lease.get("pid"),
                                                                          lease.get("command")))

    def _add_back(self, intent: dict[str, Any]) -> str:
        """The drained replica back into the router: once its drain is over (or DRAIN_WAIT_S passed), POSTed again
        every few seconds until the router lists it (smg registers a worker only once it answers its health
        check: a replica whose own replace was interrupted is being started again by its own guard)."""
        url, end, drain_end, posted = str(intent["url"]), time.monotonic() + READD_S, time.monotonic() + DRAIN_WAIT_S, 0.0
        while time.monotonic() < end:
            have = _router_workers(intent, self.router_key or self.secret)
            if have is not None and url in have and (posted or time.monotonic() > drain_end):
                return "added %s back to the router" % url
            if have is not None and url not in have and time.monotonic() - posted >= READD_EVERY_S \
                    and _worker_answers(url, self.secret):  # asked before, smg looks again only every 30 s
                self._still_ours()
                body = dict({"url": url}, **({"api_key": self.secret} if self.secret else {}))
                stale = _pending(_router_call(intent, self.router_key or self.secret, "POST", "/workers", body))
                if stale:  # an earlier POST's job (the client's): deleted, and the worker POSTed again
                    _router_call(intent, self.router_key or self.secret, "DELETE", "/workers/" + stale)
                    _router_call(intent, self.router_key or self.secret, "POST", "/workers", body)
                posted = time.monotonic()
            time.sleep(1.0)
        return "%s was not listed by the router within %gs (asked again until then)" % (url, READD_S)

    def _bring_back(self, intent: dict[str, Any], token: str) -> str:
        old = _run_dir(self.deployment, str(intent["old_run"]))
        new = _run_dir(self.deployment, str(intent["new_run"])) if intent.get("new_run") else None
        self._still_ours()
        current = _current(self.deployment)
        if current is not None and current != old and os.path.isdir(current):
            now = status_of(current)
            if now.get("alive") or now.get("supervisor_alive"):
                return "the replacement %s was started; left running" % os.path.basename(current)
        self._stopped(old, intent)
        if new is not None and _complete(new):
            why = self._start(new, token, intent)
            if not why:
                return "started the new version %s (the previous %s stays stopped)" % (
                    os.path.basename(new), os.path.basename(old))
            self._stopped(new, intent)
            again = self._start(old, token, intent)
            return again or "the new version %s did not come up (%s); started the previous version %s again" % (
                os.path.basename(new), why, os.path.basename(old))
        return self._start(old, token, intent) or "started the previous version %s again" % os.path.basename(old)

    @staticmethod
    def _stopped(run: str, intent: dict[str, Any]) -> None:
        """`run` stopped (a stop still in progress ends first; a run that never started has nothing to stop)."""
        now = status_of(run)
        if now.get("alive") or now.get("supervisor_alive"):
            cmd_stop(run, float(intent.get("grace_s") or 0), "replace")

    def _start(self, run: str, token: str, intent: dict[str, Any]) -> str:
        """Start `run` once its ports are free: "" when it runs (for `--new`: reached ready), else why not."""
        name = os.path.basename(run)
        busy = _wait_ports(_intent_ports(intent))
        if busy is not None:
            return "%s was not started: port %d stayed busy (held by %s)" % (name, busy, _held_by(busy))
        self._still_ours()
        _set_current(self.deployment, run)
        env = dict(os.environ, **{FENCE_ENV: token})
        done = subprocess.run([sys.executable or "python3", *PYTHON_FLAGS, os.path.join(run, "supervise.py"), "start", run],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env, timeout=START_S)
        if done.returncode != 0:
            why = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[-1:]
            return "starting %s failed: %s" % (name, " ".join(why))
        if run != str(intent.get("new_run") or ""):
            return ""
        return _ready(run)


def _ready(run: str) -> str:
    """"" once the run's supervisor says ready (its ready line was logged) within NEW_READY_S, else why not."""
    end = time.monotonic() + NEW_READY_S
    while time.monotonic() < end:
        now = status_of(run)
        if now.get("status") == "ready":
            return ""
        if now.get("status") not in ("starting", "running"):
            return "it is %s" % now.get("status")
        time.sleep(POLL_S)
    return "not ready within %gs" % NEW_READY_S


USAGE = ("usage: supervise_guard.py arm DEPLOYMENT_DIR --old RUN_DIR --grace S [--port P[,Q]] [--new RUN_DIR] | "
         "arm-router DEPLOYMENT_DIR")


def _options(argv: list[str]) -> tuple[str, str, dict[str, str]]:
    if len(argv) < 2 or argv[0] not in ("arm", "arm-router"):
        raise SuperviseError(USAGE, EXIT_BAD_INPUT)
    opts, rest = {}, list(argv[2:])
    while rest:
        word = rest.pop(0)
        if not word.startswith("--") or not rest:
            raise SuperviseError("bad argument %r" % word, EXIT_BAD_INPUT)
        opts[word[2:]] = rest.pop(0)
    return argv[0], argv[1], opts


def _replace_intent(deployment: str, opts: dict[str, str]) -> dict[str, Any]:
    try:
        old, grace = _run_dir(deployment, opts["old"]), float(opts.get("grace") or 0)
        ports = [int(p) for p in opts["port"].split(",")] if opts.get("port") else []
    except (KeyError, ValueError):
        raise SuperviseError("--old RUN_DIR and a numeric --grace (and --port P[,Q]) are needed",
                             EXIT_BAD_INPUT) from None
    new = _run_dir(deployment, opts["new"]) if opts.get("new") else None
    if new == old:
        raise SuperviseError("--new and --old name the same run", EXIT_BAD_INPUT)
    return {"old_run": old, "new_run": new, "grace_s": grace, "ports": ports}


def _router_intent() -> tuple[dict[str, Any], str, str]:
    """From stdin: {"url", "address", "port", "api_key"?, "router_key"?}; the keys stay out of the intent."""
    try:
        data = json.loads(sys.stdin.read(65536) or "null")
        intent = {"url": str(data["url"]), "address": str(data["address"]), "port": int(data["port"])}
    except (ValueError, KeyError, TypeError):
        raise SuperviseError("arm-router reads {url, address, port, api_key?} as JSON on stdin",
                             EXIT_BAD_INPUT) from None
    return intent, str(data.get("api_key") or ""), str(data.get("router_key") or "")


def _log_fd(deployment: str) -> int:
    path = os.path.join(deployment, REPAIR_LOG)
    fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644, "repair log")
    if os.fstat(fd).st_size > LOG_MAX:
        os.ftruncate(fd, 0)
    return fd


def arm(argv: list[str]) -> int:
    what, where, opts = _options(argv)
    deployment = os.path.abspath(where)
    check_dirs(deployment, deployment)  # ours alone, as the lock's folder is
    tokens = take_fence()
    if not tokens:
        raise SuperviseError("not armed: no lease tokens (run it through deployer's helper, under the lock)")
    guard = Guard(deployment, tokens, INTENT if what == "arm" else ROUTER_INTENT)
    if what == "arm":
        intent = _replace_intent(deployment, opts)
    else:
        intent, guard.secret, guard.router_key = _router_intent()
    intent["armed_at"] = time.time()
    log = _log_fd(deployment)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    if os.fork() == 0:  # the guard: its own session, its output in the repair log, nothing of the helper's held
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() == 0:
                _guard_main(guard, log, write_fd, intent)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.close(log)
    answer = b""
    while True:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        answer += chunk
    os.close(read_fd)
    if not answer.startswith(b"{"):
        raise SuperviseError("the guard did not start: %s" % answer.decode("utf-8", "replace").strip()[:300])
    print(answer.decode().strip(), flush=True)
    return 0


def _guard_main(guard: Guard, log: int, report: int, intent: dict[str, Any]) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    try:
        write_json(guard.intent, dict(intent, guard_pid=os.getpid()))
    except OSError as e:
        os.write(report, ("cannot write %s: %s" % (guard.intent, e.strerror)).encode())
        os.close(report)
        return
    os.write(report, json.dumps({"guard_pid": os.getpid()}).encode())
    os.close(report)
    what = intent.get("url") or os.path.basename(str(intent.get("old_run")))
    _log("guard %d armed for %s: repairs if the client is gone" % (os.getpid(), what))
    try:
        _log(guard.watch())
    except Exception as e:  # noqa: BLE001 - the guard's log is the only place anyone reads this
        _log("guard failed: %s: %s" % (type(e).__name__, e))


def main(argv: list[str] | None = None) -> int:
    try:
        return arm(sys.argv[1:] if argv is None else argv)
    except (SuperviseError, UnsafePath) as e:
        print("supervise_guard: %s" % e, file=sys.stderr, flush=True)
        return getattr(e, "code", 1)
    except OSError as e:
        print("supervise_guard: %s" % (e.strerror or e), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
