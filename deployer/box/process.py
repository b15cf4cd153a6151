"""Start: drive the target-side supervisor (start/stop/status) and the port check (the lock: deployer/box/lock.py).

The supervisor (deployer/supervisor/, stdlib only) runs on the target's python3 with -B (no __pycache__ that a
full disk could truncate); these functions are the only place that knows its command line. `start` runs the
run dir's own copy (it becomes the daemon); the other commands send this deployer's copy over stdin, so they
work on a run whose payload is damaged or missing.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deployer.errors import CommandFailed, PortBusy, TargetError
from deployer.box.push import Layout, RunDir
from deployer.remote.base import Remote, Result
from deployer.remote.program import SUPERVISOR_PYTHON
from deployer.supervisor.protocol import INTENT as REPAIR_INTENT, ROUTER_INTENT
from deployer.supervisor.protocol import STOP_REQUEST_JSON

EXIT_BUSY = 75


@dataclass(frozen=True)
class Launch:
    """A started engine: where it runs and where its output goes."""

    run: RunDir
    pid: int
    pgid: int
    started_at: float
    log_offset: int


def supervisor(script: str, *args: str) -> str:
    return " ".join([SUPERVISOR_PYTHON, *(shlex.quote(w) for w in (script, *args))])


def run_supervisor(remote: Remote, *args: str, timeout: float, check: bool = True) -> Result:
    """Run a supervisor command from this deployer's own copy, sent over stdin (nothing on disk is used); on a
    helper conversation the read-only ones are answered by the helper itself (the same code, no new process)."""
    result = remote.helper.supervise(args, timeout)
    if check and not result.ok:
        raise CommandFailed(result, host=remote.label)
    return result


def _json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return {}


def start(remote: Remote, run: RunDir) -> Launch:
    """Start the run's engine under its supervisor; the port claim and the start are one step on the target."""
    result = remote.run(supervisor(run.file("supervise.py"), "start", run.path), timeout=30, check=False)
    if not result.ok:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        detail = " | ".join(line.removeprefix("supervise: ") for line in tail) or "no output"
        if result.exit_code == EXIT_BUSY:
            raise PortBusy(f"{detail} on {remote.label}", hint="stop what holds it, or set engine.port to another port")
        raise TargetError(f"supervisor could not start the engine: {detail}")
    state = _json_line(result.stdout)
    if not state.get("pid"):
        raise TargetError(f"supervisor did not report an engine pid (got {result.stdout.strip()[:200]!r})")
    return Launch(run=run, pid=int(state["pid"]), pgid=int(state.get("pgid") or state["pid"]),
                  started_at=float(state.get("started_at") or time.time()),
                  log_offset=int(state.get("log_offset") or 0))


def status(remote: Remote, run: RunDir) -> dict[str, Any]:
    result = run_supervisor(remote, "status", run.path, timeout=30, check=False)
    if not result.ok:
        return {"status": "absent", "error": (result.stderr or result.stdout).strip()[:300]}
    return _json_line(result.stdout)


def stop(remote: Remote, run: RunDir, grace: float, why: str | None = None, drain_s: float = 0.0) -> dict[str, Any]:
    """Stop the run's engine; `why` "replace" records that nobody asked for the deployment to stop (an `up`
    replacing it), so an interrupted replace never reads as a deliberate `down`; "failed": deployer ends a failed
    attempt (a rank that ended by itself keeps the status it ended with). None: a deliberate stop (`down`).
    `drain_s`: the run's restart.drain_s (drain_of its record): the supervisor lets the engine drain that long
    before the grace starts, so the wait for its answer is that much longer."""
    extra = ("--why", why) if why else ()
    result = run_supervisor(remote, "stop", run.path, "--grace", f"{grace:g}", *extra,
                            timeout=grace + drain_s + 30)
    return _json_line(result.stdout)


def announce_stop(remote: Remote, run: RunDir, grace: float, why: str) -> None:
    """Write the run's stop request without stopping it yet: a node group's replace announces the stop on every
    rank before it stops any, so a rank whose engine ends because a peer went first is recorded as stopped, not
    as a crash of its version (supervisor/daemon.py STOP_AHEAD_S; the stop itself rewrites the request)."""
    request = json.dumps({"grace_s": grace, "why": why}).encode()
    remote.put(request, posixpath.join(run.path, STOP_REQUEST_JSON), 0o600)


def drain_of(record: Mapping[str, Any]) -> float:
    """restart.drain_s of the run whose profile.json is `record` (0 when it does not say: an older run)."""
    value = (((record.get("profile") or {}).get("restart") or {}).get("drain_s"))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0.0


def rescue(remote: Remote, layout: Layout, grace: float) -> str:
    """`down` of a deployment whose dir became unsafe (supervise.py `rescue`, this deployer's copy over stdin:
    nothing under the dir is read or run): what was stopped, in a few words."""
    result = run_supervisor(remote, "rescue", layout.root, "--grace", f"{grace:g}", timeout=grace + 30)
    data = _json_line(result.stdout)
    stopped, groups = data.get("stopped") or [], data.get("groups") or []
    if not stopped and not groups:
        return "no process of it was running"
    said = [f"supervisor pid(s) {', '.join(str(p) for p in stopped)}" if stopped else "",
            f"engine process group(s) {', '.join(str(g) for g in groups)}" if groups else ""]
    return f"stopped {' and '.join(w for w in said if w)}; @reboot entry: {data.get('on_boot', 'unknown')}"


def forget_boot(remote: Remote, run: RunDir) -> str:
    """Removes the deployment's boot-time start (`down`): what the supervisor did ("removed", "none",
    "unavailable: ...", "failed: ..."); a deployer whose supervisor is older says "unknown"."""
    result = run_supervisor(remote, "boot", run.path, "off", timeout=30, check=False)
    return str(_json_line(result.stdout).get("on_boot") or "unknown")


@dataclass(frozen=True)
class Listener:
    """Who listens on the engine port: `ours` True when a process of the run's engine group does."""

    ours: bool | None                # None: nobody listens
    holders: list[str]               # the listeners that are not ours ("pid N (comm) of run DIR")

    def describe(self) -> str:
        return ", ".join(self.holders) or "nobody"


def listener(remote: Remote, run: RunDir, port: int) -> Listener:
    """Whether the listener on `port` is a process of this run's engine group (mapped from /proc on the target)."""
    data = _json_line(run_supervisor(remote, "listener", run.path, str(port), timeout=30).stdout)
    ours = data.get("ours")
    return Listener(ours if isinstance(ours, bool) else None, [str(h) for h in data.get("holders") or []])


def port_free(remote: Remote, layout: Layout, port: int, wait_s: float = 0.0) -> tuple[bool, str]:
    """Whether the engine port is unclaimed and can be bound on the target; waits up to wait_s for it to free."""
    deadline = time.monotonic() + wait_s
    while True:
        result = run_supervisor(remote, "ports", str(port), timeout=20, check=False)
        if result.exit_code == 0:
            return True, ""
        if result.exit_code != 1:
            raise CommandFailed(result, host=remote.label, what="port check")
        if time.monotonic() >= deadline:
            return False, result.stdout.strip()
        time.sleep(0.5)


def check_port(remote: Remote, layout: Layout, port: int, wait_s: float = 0.0) -> None:
    free, detail = port_free(remote, layout, port, wait_s)
    if not free:
        holders = detail.split(": ", 1)[1] if detail.startswith("busy ") and ": " in detail else detail
        raise PortBusy(f"port {port} taken by {holders} on {remote.label}",
                       hint="stop what holds it, or set engine.port to another port")


@dataclass(frozen=True)
class ReplaceGuard:
    """What a replace's guard is armed with: the run that replaces `old`, the stop's grace, the ports to wait for,
    and whether the guard starts `new` (a router: its run dir complete; `old` again when it does not come up) or
    brings back `old` (an engine: only the version that reached ready is trusted)."""

    new: RunDir
    old: RunDir
    grace_s: float
    ports: tuple[int, ...] = ()
    start_new: bool = False


def arm_repair(remote: Remote, layout: Layout, guard: ReplaceGuard) -> bool:
    """Before a replace stops `old`: a guard on the target (supervise_guard.py, from the new run dir's own copy)
    that finishes the replace by itself if this client dies before it disarms (kill -9: nobody is left to do it);
    whether it was armed (a target where it cannot be is repaired by the next `up`, as before)."""
    args = ["arm", layout.root, "--old", guard.old.path, "--grace", f"{guard.grace_s:g}"]
    args += ["--port", ",".join(str(p) for p in guard.ports)] if any(guard.ports) else []
    args += ["--new", guard.new.path] if guard.start_new else []
    result = remote.run(supervisor(guard.new.file("supervise_guard.py"), *args), timeout=30, check=False)
    return result.ok and bool(_json_line(result.stdout).get("guard_pid"))


def arm_router_repair(remote: Remote, layout: Layout, url: str, address: str, port: int, api_key: str | None,
                      router_key: str | None = None) -> bool:
    """Before a rolling restart drains the replica at `url` out of the router of deployment `layout` (this host): a
    guard that adds it back by itself if this client dies first (supervise_guard.py `arm-router`, the deployment's
    own synced copy; the replicas' API key and the router's control key travel on stdin and stay in the guard's
    memory)."""
    body = json.dumps({"url": url, "address": address, "port": port, "api_key": api_key or "",
                       "router_key": router_key or ""}).encode()
    result = remote.run(supervisor(posixpath.join(layout.root, "supervise_guard.py"), "arm-router", layout.root),
                        timeout=30, check=False, stdin=body)
    return result.ok and bool(_json_line(result.stdout).get("guard_pid"))


def disarm_repair(remote: Remote, layout: Layout, router: bool = False, left_stopped: str | None = None) -> None:
    """The replace is finished (its new version started, or what it stopped brought back), or the drained replica
    is back in its router (or deliberately left out): the guard leaves. A replace's guard leaves only once it saw
    for itself that `current`'s run is up (supervise_guard.py); a client that leaves the stopped version stopped on
    purpose (`--no-rollback`) says so (`left_stopped`: why), else the guard starts it again once the lock is free."""
    path = posixpath.join(layout.root, ROUTER_INTENT if router else REPAIR_INTENT)
    if left_stopped:
        remote.put(json.dumps({"left_stopped": left_stopped}).encode(), path, 0o600)
        return
    remote.helper.remove([path], layout.root)
