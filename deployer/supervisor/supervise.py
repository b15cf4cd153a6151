#!/usr/bin/env python3
"""The supervisor deployer pushes into every run dir; it runs on the TARGET with its system python3.

Stdlib only, Python >= 3.8.  `python3 supervise.py CMD ...`:
  start RUN_DIR              detach a daemon that runs launch.sh in its own process group; print state JSON
  stop RUN_DIR [--grace S] [--why replace]
                             SIGTERM the engine group, SIGKILL after the grace; print the final state JSON.
                             --why replace records "stopped_for": "replace" (an `up` replacing it: nobody asked
                             for the deployment to stop); a stop without it clears that note
  status RUN_DIR             print state.json plus "alive" / "supervisor_alive" ("lost" when both are gone),
                            "supervisor" (ok, dead, frozen: heartbeat_at older than HEARTBEAT_STALE), "heartbeat_age_s"
  ports PORT                 exit 0 if PORT is unclaimed and free on 127.0.0.1 and 0.0.0.0, else 1 and who holds it
  listener RUN_DIR PORT      print whether the listener on PORT is a process of the run's engine group
  rescue DEPLOYMENT_DIR [--grace S]
                             `down` when the deployment dir became unsafe (another user controls a directory or a
                             link on its path): nothing is read there. The supervisors and engine groups deployer
                             started for it are found in /proc (this user's processes whose argv or environment name
                             a run dir under it), stopped (SIGTERM, SIGKILL after the grace), and its @reboot entry
                             removed; print {"stopped": [pids], "groups": [pgids], "on_boot": ...}
start claims the engine port host-wide first (ports.py); a port taken exits 75 naming its holder.
State: starting -> running -> ready [-> restarting -> running ...] -> stopped | exited | crashloop.
Bad input exits 2, other failures 1, always with one line on stderr. The deployment lock is supervise_lease.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from .base import (
    CRASHED, DEFAULTS, EXIT_BAD_INPUT, EXIT_BUSY, KILL_WAIT, LIVE, RUN_LOCK, START_TIMEOUT, STATE,
    STOP_REQUEST, SuperviseError, drain_s, group_alive, kill_group, load_config, read_env_file,
    open_dir, pid_alive, PYTHON_FLAGS, read_state, supervision, supervisor_alive, wait_until, write_json,
)
from .daemon import _daemon_main
from .ports import PortTaken, claim_port, claimed_by, listener_of, port_bindable, port_holders

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
    run_fd = open_dir(run_dir, run_dir)  # no link another user controls on the way (UnsafePath: one line, exit 77)
    try:
        return _start(run_dir, run_fd)
    finally:
        os.close(run_fd)


def _start(run_dir: str, run_fd: int) -> int:
    cfg = load_config(run_dir)
    env = read_env_file(os.path.join(run_dir, cfg["env_file"])) if cfg["env_file"] else {}
    lock_fd = _take_run_lock(run_dir)  # inherited by the daemon, held for its whole life
    old = read_state(run_dir) or {}
    if group_alive(old.get("pgid")):
        os.close(lock_fd)
        raise SuperviseError(f"engine group {old['pgid']} of an earlier supervisor is still alive; stop it first")
    claim_fd = _claim(run_dir, cfg, lock_fd)  # inherited by the daemon and the engine: held while either lives
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
                _daemon_main(run_dir, cfg, env, [write_fd, lock_fd], claim_fd, run_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.close(lock_fd)
    if claim_fd is not None:
        os.close(claim_fd)
    os.waitpid(child, 0)
    line = _read_report(read_fd, START_TIMEOUT)
    if line.startswith("ERR "):
        raise SuperviseError(line[4:])
    if cfg.get("on_boot") is True:  # the engine runs: from now on a reboot starts this run again
        try:
            line = json.dumps(dict(json.loads(line), on_boot=set_boot_entry(run_dir, True)), sort_keys=True)
        except ValueError:
            pass
    print(line, flush=True)
    return 0


# -- the boot-time start: an @reboot entry in the user's crontab (no root, no lingering systemd user needed) --------
BOOT_MARK = "# deployer-on-boot "
CRONTAB_TIMEOUT = 10.0


def _crontab(args: list[str], text: str | None = None) -> tuple[int, str]:
    """Runs the user's crontab program: (exit code, stdout); (-1, why) when there is none or it hangs."""
    exe = shutil.which("crontab")
    if exe is None:
        return -1, "no crontab program on this host"
    try:
        done = subprocess.run([exe, *args], input=text, capture_output=True, text=True, timeout=CRONTAB_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, f"crontab {' '.join(args)}: {e}"
    return done.returncode, done.stdout if done.returncode == 0 else (done.stderr.strip() or done.stdout)


# The @reboot command: `python -B -c BOOT_CHECK SCRIPT RUN_DIR LOG`. It runs the run's supervise.py only when every
# directory on its real path, and the script itself, is root's or this user's and not writable by others (group
# write only by the user's own private group; a directory only when sticky, as base.dir_problem says): a path another user came to control after `up` (a parent made world-writable, the
# workdir swapped for that user's tree) is refused and nothing there runs or is written (issue 34). The log is
# opened by the check (no link followed), not by a shell redirect through the path. No % (a newline to cron).
BOOT_CHECK = (
    "import grp, os, pwd, stat, sys; script, run, log = sys.argv[1:4]; me = os.geteuid(); "
    "name = next((u.pw_name for u in pwd.getpwall() if u.pw_uid == me), None); "
    "private = lambda gid: gid == os.getegid() and any(g.gr_gid == gid and g.gr_name == name and "
    "set(g.gr_mem) <= {name} for g in grp.getgrall()); "
    "others = lambda st: st.st_mode & 0o002 or (st.st_mode & 0o020 and not private(st.st_gid)); "
    "real = os.path.realpath(script); parts = real.split('/')[1:]; "
    "paths = ['/' + '/'.join(parts[:i + 1]) for i in range(len(parts))]; "
    "bad = [p for p in paths for st in [os.lstat(p)] if st.st_uid not in (0, me) or (others(st) and not "
    "(stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX))]; "
    "bad and sys.exit('deployer on-boot: ' + bad[0] + ' is not safe (another user controls it): ' + run + "
    "' not started'); "
    "fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600); os.dup2(fd, 1); "
    "os.dup2(fd, 2); os.execv(sys.executable, [sys.executable, '-B', '-S', real, 'start', run])"
)


def boot_entry(run_dir: str) -> str | None:
    """The crontab line that starts `run_dir` at boot (this python, the run's own supervise.py, reached only through
    a path BOOT_CHECK finds safe at boot), marked with the deployment dir so that the next start replaces it and
    `down` removes it; None for a path crontab would mangle (a % is a newline there)."""
    root = os.path.dirname(os.path.dirname(run_dir))
    script = os.path.join(run_dir, "supervise.py")
    log = os.path.join(run_dir, "boot.log")
    words = (sys.executable or "python3", *PYTHON_FLAGS, "-c", BOOT_CHECK, script, run_dir, log)
    line = f"@reboot {' '.join(shlex.quote(w) for w in words)} {BOOT_MARK}{root}"
    return None if any(c in line for c in "%\n\r") else line


def _table_without(table: str, root: str) -> list[str]:
    return [line for line in table.splitlines() if line.strip() and not line.endswith(f"{BOOT_MARK}{root}")]


def set_boot_entry(run_dir: str, on: bool) -> str:
    """Installs (on) or removes this deployment's @reboot entry, leaving every other line of the table as it was;
    what happened, in a few words (never raises: a box without cron only loses the boot-time start)."""
    root = os.path.dirname(os.path.dirname(run_dir))
    code, table = _crontab(["-l"])
    if code == -1:
        return f"unavailable: {table}"
    if code != 0:  # "no crontab for USER"
        table = ""
    lines = _table_without(table, root)
    if on:
        entry = boot_entry(run_dir)
        if entry is None:
            return "unavailable: the run dir's path holds a character crontab cannot carry"
        lines.append(entry)
    elif len(lines) == len([x for x in table.splitlines() if x.strip()]):
        return "none"
    code, why = _crontab(["-"], "".join(line + "\n" for line in lines))
    if code != 0:
        return f"failed: {why[:200]}"
    return "installed" if on else "removed"


def cmd_boot(run_dir: str, what: str) -> int:
    """`boot RUN on|off`: the deployment's boot-time start (on: this run; off: none, as `down` asks)."""
    if what not in ("on", "off"):
        raise SuperviseError("usage: supervise.py boot RUN on|off", EXIT_BAD_INPUT)
    print(json.dumps({"on_boot": set_boot_entry(run_dir, what == "on")}, sort_keys=True), flush=True)
    return 0


def _claim(run_dir: str, cfg: dict[str, Any], lock_fd: int) -> int | None:
    """The port claim and a bind check as one step, before anything starts; None for a config with no port."""
    port = cfg.get("port")
    if not isinstance(port, int) or isinstance(port, bool):
        return None
    try:
        fd = claim_port(port, run_dir, str(cfg.get("name") or os.path.basename(os.path.dirname(
            os.path.dirname(run_dir)))))
    except PortTaken as e:
        os.close(lock_fd)
        raise SuperviseError(str(e), EXIT_BUSY) from None
    if not port_bindable(port):
        os.close(fd)
        os.close(lock_fd)
        raise SuperviseError(f"port {port} taken by {', '.join(port_holders(port)) or 'a process unknown'}",
                             EXIT_BUSY)
    return fd


def status_of(run_dir: str) -> dict[str, Any]:
    """state.json plus liveness; a live-looking state whose daemon and group are gone is "lost"."""
    state = read_state(run_dir)
    if state is None:
        return {"status": "absent", "alive": False, "supervisor_alive": False}
    state["alive"] = group_alive(state.get("pgid"))
    state["supervisor_alive"] = supervisor_alive(state.get("supervisor_pid"))
    if state.get("status") in LIVE and not state["alive"] and not state["supervisor_alive"]:
        state["status"] = "lost"
    now = time.time()
    state["supervisor"] = supervision(state, now)  # dead / frozen: nothing restarts the engine (deploy status)
    beat = state.get("heartbeat_at")
    state["heartbeat_age_s"] = round(now - beat, 1) if isinstance(beat, (int, float)) else None
    return state


def cmd_status(run_dir: str) -> int:
    print(json.dumps(status_of(run_dir), sort_keys=True), flush=True)
    return 0


def _note_why(run_dir: str, why: str | None) -> None:
    """Record (or clear) why a stopped run was stopped: `deploy status` tells an interrupted replace from a down."""
    state = read_state(run_dir)
    if state is None or state.get("status") != "stopped" or state.get("stopped_for") == why:
        return
    if why:
        state["stopped_for"] = why
    else:
        state.pop("stopped_for", None)
    try:
        write_json(os.path.join(run_dir, STATE), state)
    except OSError:
        pass  # a full disk: the stop itself happened


def cmd_stop(run_dir: str, grace: float | None, why: str | None = None) -> int:
    if grace is None:
        try:
            grace = float(load_config(run_dir)["grace_s"])
        except SuperviseError:
            grace = float(DEFAULTS["grace_s"])
    try:
        drain = drain_s(load_config(run_dir))  # the daemon lets the engine drain first (restart.drain_s)
    except SuperviseError:
        drain = 0.0
    before = status_of(run_dir)
    sup, pgid = before.get("supervisor_pid"), before.get("pgid")
    if not before["alive"] and not before["supervisor_alive"]:
        # a deliberate stop (`down`) of a run that ended by itself: now stopped as asked; deployer's own stops
        # (a replace, a failed attempt's clean-up) leave an ended run as it ended
        ended = _stopped_ended(run_dir, before) if why is None else before
        _note_why(run_dir, why)  # a `down` of a replace left half done: now it is a deliberate stop
        print(json.dumps(dict(status_of(run_dir) if why is None else ended, was_running=False), sort_keys=True),
              flush=True)
        return 0
    if before["supervisor_alive"] and isinstance(sup, int):
        try:
            write_json(os.path.join(run_dir, STOP_REQUEST), dict({"grace_s": grace}, **({"why": why} if why else {})))
        except OSError:
            pass  # a full disk: the supervisor stops with its configured grace
        try:
            os.kill(sup, signal.SIGTERM)
        except ProcessLookupError:
            pass
        wait_until(lambda: not supervisor_alive(sup) and not group_alive(pgid), grace + drain + KILL_WAIT)
    elif before["alive"]:  # the daemon is gone: the group is ours to end
        kill_group(pgid, signal.SIGTERM)
        wait_until(lambda: not group_alive(pgid), grace)
    if group_alive(pgid):
        kill_group(pgid, signal.SIGKILL)
        if not wait_until(lambda: not group_alive(pgid), KILL_WAIT):
            raise SuperviseError(f"engine process group {pgid} survived SIGKILL")
    state = read_state(run_dir) or {}
    final: dict[str, Any] | None = None
    if state.get("status") in LIVE:  # nobody left to write the final state
        state.update(status="stopped", ended_at=time.time(), updated_at=time.time())
        try:
            write_json(os.path.join(run_dir, STATE), state)
        except OSError as e:
            final = dict(state, alive=False, supervisor_alive=False, note=f"{STATE} not updated: {e.strerror}")
    if final is None:
        _note_why(run_dir, why)
    print(json.dumps(dict(final or status_of(run_dir), was_running=True), sort_keys=True), flush=True)
    return 0


def _stopped_ended(run_dir: str, before: dict[str, Any]) -> dict[str, Any]:
    """A stop asked of a run that ended by itself (exited, crashloop, lost): nothing to signal, but from now on
    it is stopped as asked (status 8), not a crash an on-call engineer cannot silence; `stopped_from` keeps what
    it was, `last_crash` stays."""
    if before.get("status") not in CRASHED:
        return before
    state = read_state(run_dir) or {}
    state.update(status="stopped", stopped_from=before["status"], updated_at=time.time())
    state.setdefault("ended_at", time.time())
    try:
        write_json(os.path.join(run_dir, STATE), state)
    except OSError as e:
        return dict(before, note=f"{STATE} not updated: {e.strerror}")
    return status_of(run_dir)


def cmd_ports(port: int) -> int:
    if not 0 < port < 65536:
        raise SuperviseError(f"bad port {port}", EXIT_BAD_INPUT)
    claim = claimed_by(port)
    if claim is None and port_bindable(port):
        print(f"free {port}", flush=True)
        return 0
    who = ([claim] if claim else []) + port_holders(port)
    print(f"busy {port}: {', '.join(who) or 'a process that cannot be inspected from here'}", flush=True)
    return 1


def cmd_listener(run_dir: str, port: int) -> int:
    """Whether the listener on PORT belongs to the run's engine group (ready means this run's engine)."""
    state = read_state(run_dir) or {}
    print(json.dumps(listener_of(port, state.get("pgid")), sort_keys=True), flush=True)
    return 0


RUN_DIR_ENV = b"DEPLOYER_RUN_DIR="


def _proc_words(pid: int, what: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read(1 << 20).split(b"\0")
    except OSError:
        return []


def _under(path: bytes, runs: bytes) -> bool:
    return path.startswith(runs) and b"/" not in path[len(runs):].rstrip(b"/") and len(path) > len(runs)


def deployment_processes(root: str) -> tuple[list[int], set[int]]:
    """(supervisor daemon pids, engine process groups) of the deployment at `root`: processes of this user only
    (their /proc entry is ours), a daemon by its argv (`supervise.py start RUN`), an engine by the run dir its
    supervisor put in its environment (DEPLOYER_RUN_DIR). Nothing under `root` is read."""
    runs = (root.rstrip("/") + "/runs/").encode()
    daemons: list[int] = []
    groups: set[int] = set()
    me = os.geteuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
        except OSError:
            continue
        argv = _proc_words(pid, "cmdline")
        at = argv.index(b"start") if b"start" in argv else -1
        if 0 < at < len(argv) - 1 and _under(argv[at + 1], runs) and any(a.endswith(b"supervise.py")
                                                                          for a in argv[:at]):
            daemons.append(pid)
            continue
        run = next((e[len(RUN_DIR_ENV):] for e in _proc_words(pid, "environ") if e.startswith(RUN_DIR_ENV)), None)
        if run is not None and _under(run, runs):
            try:
                groups.add(os.getpgid(pid))
            except OSError:
                continue
    return daemons, groups


def cmd_rescue(root: str, grace: float | None) -> int:
    """Stops what deployer started for the deployment at `root` without reading anything there (see `rescue`)."""
    root = os.path.normpath(os.path.abspath(root))
    daemons, groups = deployment_processes(root)
    for pid in daemons:
        try:
            os.kill(pid, signal.SIGTERM)  # a supervisor stops its engine group itself, gracefully
        except OSError:
            pass
    wait = float(DEFAULTS["grace_s"] if grace is None else grace) + KILL_WAIT
    wait_until(lambda: not any(group_alive(g) for g in groups) and not any(pid_alive(p) for p in daemons), wait)
    for pgid in groups:
        kill_group(pgid, signal.SIGKILL)
    for pid in daemons:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    on_boot = set_boot_entry(os.path.join(root, "runs", "x"), False)
    print(json.dumps({"stopped": sorted(daemons), "groups": sorted(groups), "on_boot": on_boot}, sort_keys=True),
          flush=True)
    return 0


def _run_dir(arg: str) -> str:
    path = os.path.abspath(arg)
    if not os.path.isdir(path):
        raise SuperviseError(f"no such run dir: {arg}", EXIT_BAD_INPUT)
    return path


def _parse(argv: list[str]) -> tuple[str, list[str], dict[str, str]]:
    """Tiny parser: (command, positionals, --options); argparse would print usage over several lines."""
    if not argv:
        raise SuperviseError("usage: supervise.py start|stop|status|ports|listener|boot|rescue ...", EXIT_BAD_INPUT)
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
    allowed = {"start": (), "status": (), "stop": ("grace", "why"), "ports": (), "listener": (), "boot": (),
               "rescue": ("grace",)}
    if cmd not in allowed:
        raise SuperviseError(f"unknown command {cmd!r} (start|stop|status|ports|listener|boot|rescue)",
                             EXIT_BAD_INPUT)
    if len(pos) != (2 if cmd in ("listener", "boot") else 1) or set(opts) - set(allowed[cmd]):
        raise SuperviseError(f"usage: supervise.py {cmd} ARG {' '.join('--' + o + ' X' for o in allowed[cmd])}",
                             EXIT_BAD_INPUT)
    try:
        grace = float(opts["grace"]) if "grace" in opts else None
        port = int(pos[-1]) if cmd in ("ports", "listener") else 0
    except ValueError:
        raise SuperviseError(f"{cmd}: not a number: {opts.get('grace', pos[-1])}", EXIT_BAD_INPUT) from None
    if cmd == "ports":
        return cmd_ports(port)
    if cmd == "rescue":
        return cmd_rescue(pos[0], grace)
    run_dir = _run_dir(pos[0])
    if cmd == "boot":
        return cmd_boot(run_dir, pos[1])
    if cmd == "listener":
        return cmd_listener(run_dir, port)
    if cmd == "stop" and opts.get("why", "replace") not in ("replace", "failed"):
        raise SuperviseError(f"stop: --why is replace, failed or nothing, not {opts['why']!r}", EXIT_BAD_INPUT)
    return cmd_start(run_dir) if cmd == "start" else cmd_stop(run_dir, grace, opts.get("why")) if cmd == "stop" \
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
